-- 0003: org secrets, set through the API and referred to by name from the org's providers (api_key_secret,
-- header_secrets). A value is never stored in plaintext: value is AES-256-GCM of it under the key of
-- [control] secrets_key_env, with a random 12-byte nonce and the org id and name as additional data, so a
-- row copied to another org or name does not decrypt. The audit log takes the object 'secret' (its rows
-- name the secret, never its value): SQLite cannot change a CHECK constraint, so the table is rebuilt.

CREATE TABLE secrets (
	org_id  TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT NOT NULL,
	nonce   BLOB NOT NULL CHECK (length(nonce) = 12),
	value   BLOB NOT NULL,
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL,
	PRIMARY KEY (org_id, name)
) STRICT;

CREATE TABLE audit_new (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	at         INTEGER NOT NULL,
	generation INTEGER NOT NULL,
	actor      TEXT NOT NULL,
	org_id     TEXT,
	action     TEXT NOT NULL CHECK (action IN ('create', 'replace', 'delete', 'revoke')),
	object     TEXT NOT NULL CHECK (object IN ('org', 'provider', 'route', 'key', 'token', 'secret')),
	name       TEXT NOT NULL,
	detail     TEXT NOT NULL
) STRICT;
INSERT INTO audit_new (id, at, generation, actor, org_id, action, object, name, detail)
	SELECT id, at, generation, actor, org_id, action, object, name, detail FROM audit;
DROP TABLE audit;
ALTER TABLE audit_new RENAME TO audit;
CREATE INDEX audit_org ON audit (org_id, id);
