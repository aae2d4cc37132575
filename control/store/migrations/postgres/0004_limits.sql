-- 0004 for PostgreSQL: ../0004_limits.sql.

ALTER TABLE keys ADD COLUMN limits TEXT;
ALTER TABLE orgs ADD COLUMN limits TEXT;
ALTER TABLE orgs ADD COLUMN key_limits TEXT;
