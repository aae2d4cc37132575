-- 0005 for PostgreSQL: ../0005_usage.sql.

CREATE TABLE usage (
	org_id            TEXT COLLATE "C" NOT NULL REFERENCES orgs (id) ON DELETE CASCADE,
	key_id            TEXT COLLATE "C" NOT NULL,
	model             TEXT COLLATE "C" NOT NULL,
	hour              BIGINT NOT NULL,
	requests          BIGINT NOT NULL CHECK (requests >= 0),
	refused           BIGINT NOT NULL CHECK (refused >= 0),
	prompt_tokens     BIGINT NOT NULL CHECK (prompt_tokens >= 0),
	cached_tokens     BIGINT NOT NULL CHECK (cached_tokens >= 0),
	completion_tokens BIGINT NOT NULL CHECK (completion_tokens >= 0),
	PRIMARY KEY (org_id, key_id, model, hour)
);
CREATE INDEX usage_hour ON usage (hour);
