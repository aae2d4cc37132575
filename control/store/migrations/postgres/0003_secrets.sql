-- 0003 for PostgreSQL: ../0003_secrets.sql.

CREATE TABLE secrets (
	org_id  TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT COLLATE "C" NOT NULL,
	nonce   BYTEA NOT NULL CHECK (length(nonce) = 12),
	value   BYTEA NOT NULL,
	created BIGINT NOT NULL,
	updated BIGINT NOT NULL,
	PRIMARY KEY (org_id, name)
);

ALTER TABLE audit DROP CONSTRAINT audit_object_check;
ALTER TABLE audit ADD CONSTRAINT audit_object_check
	CHECK (object IN ('org', 'provider', 'route', 'key', 'token', 'secret'));
