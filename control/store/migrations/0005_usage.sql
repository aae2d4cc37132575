-- 0005: what each data-plane key used of each model, by UTC hour: hour is the hour's start (Unix
-- milliseconds, as every time here). Every gateway adds what it counted (Store.AddUsage) to the row of its
-- hour: a fleet sharing one store sums into the same rows. Usage is not config: adding to it does not move
-- the generation. A key id is not a reference: usage outlives its key's revocation, not its org.

CREATE TABLE usage (
	org_id            TEXT NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	key_id            TEXT NOT NULL,
	model             TEXT NOT NULL,
	hour              INTEGER NOT NULL,
	requests          INTEGER NOT NULL CHECK (requests >= 0),
	refused           INTEGER NOT NULL CHECK (refused >= 0),
	prompt_tokens     INTEGER NOT NULL CHECK (prompt_tokens >= 0),
	cached_tokens     INTEGER NOT NULL CHECK (cached_tokens >= 0),
	completion_tokens INTEGER NOT NULL CHECK (completion_tokens >= 0),
	PRIMARY KEY (org_id, key_id, model, hour)
) STRICT;
-- Reads are by time: across orgs (the superadmin's), or one org's (the primary key's prefix, then hour).
CREATE INDEX usage_hour ON usage (hour);
