-- 0001 for PostgreSQL: the schema of ../0001_init.sql, table for table and column for column (the tests
-- compare the two). Applied in one transaction by control/postgres.go, which records the version in
-- rolter_schema in the same transaction. Never edit an applied migration: add 0002_*.sql here and there.
--
-- Times are BIGINT Unix milliseconds (UTC). Text is COLLATE "C": the store sorts by bytes, as SQLite does,
-- whatever the database's locale.

-- One row: the generation every write bumps (its row lock serialises the writes of every gateway) and the
-- pepper secrets are hashed with.
CREATE TABLE meta (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	generation BIGINT NOT NULL CHECK (generation >= 0),
	pepper     BYTEA NOT NULL CHECK (length(pepper) = 32)
);

CREATE TABLE orgs (
	id      TEXT COLLATE "C" PRIMARY KEY,
	name    TEXT COLLATE "C" NOT NULL UNIQUE,
	created BIGINT NOT NULL
);

CREATE TABLE providers (
	org_id  TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT COLLATE "C" NOT NULL,
	config  BYTEA NOT NULL,
	version BIGINT NOT NULL CHECK (version >= 1),
	created BIGINT NOT NULL,
	updated BIGINT NOT NULL,
	PRIMARY KEY (org_id, name)
);

CREATE TABLE routes (
	model   TEXT COLLATE "C" PRIMARY KEY,
	org_id  TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	config  BYTEA NOT NULL,
	version BIGINT NOT NULL CHECK (version >= 1),
	created BIGINT NOT NULL,
	updated BIGINT NOT NULL
);
CREATE INDEX routes_org ON routes (org_id, model);

CREATE TABLE keys (
	id      TEXT COLLATE "C" PRIMARY KEY,
	org_id  TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT COLLATE "C" NOT NULL,
	hash    BYTEA NOT NULL UNIQUE CHECK (length(hash) = 32),
	prefix  TEXT COLLATE "C" NOT NULL,
	created BIGINT NOT NULL,
	revoked BIGINT
);
CREATE INDEX keys_org ON keys (org_id, created);

CREATE TABLE tokens (
	id      TEXT COLLATE "C" PRIMARY KEY,
	org_id  TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT COLLATE "C" NOT NULL,
	hash    BYTEA NOT NULL UNIQUE CHECK (length(hash) = 32),
	prefix  TEXT COLLATE "C" NOT NULL,
	created BIGINT NOT NULL,
	revoked BIGINT
);
CREATE INDEX tokens_org ON tokens (org_id, created);

-- id is an identity, as SQLite's AUTOINCREMENT: it only grows (writes are serialised, so in commit order).
CREATE TABLE audit (
	id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	at         BIGINT NOT NULL,
	generation BIGINT NOT NULL,
	actor      TEXT COLLATE "C" NOT NULL,
	org_id     TEXT COLLATE "C",
	action     TEXT NOT NULL CHECK (action IN ('create', 'replace', 'delete', 'revoke')),
	object     TEXT NOT NULL CHECK (object IN ('org', 'provider', 'route', 'key', 'token')),
	name       TEXT COLLATE "C" NOT NULL,
	detail     TEXT NOT NULL
);
CREATE INDEX audit_org ON audit (org_id, id);
