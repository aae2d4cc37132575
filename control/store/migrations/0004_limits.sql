-- 0004: the rate limits of data-plane keys and orgs, set through the API. Each is JSON of config.Limits
-- ({"rpm","tpm","concurrent","models"}), or NULL for none of its own: a key without its own has its org's
-- key default (orgs.key_limits), and an org or key without any has rolter.toml's [limits]. The store
-- checks them before writing (config.Limits.Check); the audit log records each change as a 'replace' of the
-- org or key.

ALTER TABLE keys ADD COLUMN limits TEXT;
ALTER TABLE orgs ADD COLUMN limits TEXT;
ALTER TABLE orgs ADD COLUMN key_limits TEXT;
