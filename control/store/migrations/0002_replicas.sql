-- 0002: the gateways that run on this store (issue 21). Each gateway's control plane records here, every
-- few seconds and after each change it applies, the store generation its config serves. Writing a row
-- is not a change of the store: it bumps no generation and has no audit row.

CREATE TABLE replicas (
	id         TEXT PRIMARY KEY,  -- host name and process id
	address    TEXT NOT NULL,     -- where its control plane listens
	version    TEXT NOT NULL,     -- its rolter version
	generation INTEGER NOT NULL,  -- the store generation its config serves
	error      TEXT NOT NULL,     -- why it does not serve a newer generation ("" when none)
	seen       INTEGER NOT NULL   -- when it last wrote this row, Unix milliseconds
) STRICT;
