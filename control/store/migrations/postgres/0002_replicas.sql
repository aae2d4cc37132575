-- 0002 for PostgreSQL: ../0002_replicas.sql.

CREATE TABLE replicas (
	id         TEXT COLLATE "C" PRIMARY KEY,
	address    TEXT NOT NULL,
	version    TEXT NOT NULL,
	generation BIGINT NOT NULL,
	error      TEXT NOT NULL,
	seen       BIGINT NOT NULL
);
