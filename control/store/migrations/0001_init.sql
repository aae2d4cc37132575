-- 0001: the first control-plane schema. Applied in one transaction by control/store/migrate.go, which
-- sets PRAGMA user_version = 1 in the same transaction. Never edit an applied migration: add 0002_*.sql.
--
-- Times are INTEGER Unix milliseconds (UTC). Configs are JSON blobs the store does not interpret. Secrets
-- are never stored: keys and tokens keep SHA-256(pepper || secret) and the first characters for display.

PRAGMA application_id = 1919904884; -- "rolt": a SQLite file of another program is refused, not migrated

-- One row: the generation every write bumps (the gateway reloads when it moves) and the pepper secrets
-- are hashed with (created once, at first open, by the store).
CREATE TABLE meta (
	id         INTEGER PRIMARY KEY CHECK (id = 1),
	generation INTEGER NOT NULL CHECK (generation >= 0),
	pepper     BLOB NOT NULL CHECK (length(pepper) = 32)
) STRICT;

CREATE TABLE orgs (
	id      TEXT PRIMARY KEY,
	name    TEXT NOT NULL UNIQUE,
	created INTEGER NOT NULL
) STRICT;

CREATE TABLE providers (
	org_id  TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT NOT NULL,
	config  BLOB NOT NULL,
	version INTEGER NOT NULL CHECK (version >= 1),
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL,
	PRIMARY KEY (org_id, name)
) STRICT;

-- The public model name is one namespace across orgs: model is the key, org_id an attribute.
CREATE TABLE routes (
	model   TEXT PRIMARY KEY,
	org_id  TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	config  BLOB NOT NULL,
	version INTEGER NOT NULL CHECK (version >= 1),
	created INTEGER NOT NULL,
	updated INTEGER NOT NULL
) STRICT;
CREATE INDEX routes_org ON routes (org_id, model);

-- Data-plane API keys. revoked is NULL while the key is valid.
CREATE TABLE keys (
	id      TEXT PRIMARY KEY,
	org_id  TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT NOT NULL,
	hash    BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
	prefix  TEXT NOT NULL,
	created INTEGER NOT NULL,
	revoked INTEGER
) STRICT;
CREATE INDEX keys_org ON keys (org_id, created);

-- Org admin tokens, the same shape as keys.
CREATE TABLE tokens (
	id      TEXT PRIMARY KEY,
	org_id  TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	name    TEXT NOT NULL,
	hash    BLOB NOT NULL UNIQUE CHECK (length(hash) = 32),
	prefix  TEXT NOT NULL,
	created INTEGER NOT NULL,
	revoked INTEGER
) STRICT;
CREATE INDEX tokens_org ON tokens (org_id, created);

-- One row per write. org_id has no foreign key: the log outlives the org it names.
CREATE TABLE audit (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	at         INTEGER NOT NULL,
	generation INTEGER NOT NULL,
	actor      TEXT NOT NULL,
	org_id     TEXT,
	action     TEXT NOT NULL CHECK (action IN ('create', 'replace', 'delete', 'revoke')),
	object     TEXT NOT NULL CHECK (object IN ('org', 'provider', 'route', 'key', 'token')),
	name       TEXT NOT NULL,
	detail     TEXT NOT NULL
) STRICT;
CREATE INDEX audit_org ON audit (org_id, id);
