package store

import (
	"context"
	"fmt"
	"time"
)

// UsageCounts are what one key used of one model: requests answered, requests its limits refused, and
// the tokens of the answers.
type UsageCounts struct {
	Requests, Refused                            int64
	PromptTokens, CachedTokens, CompletionTokens int64
}

// Add adds o to c.
func (c *UsageCounts) Add(o UsageCounts) {
	c.Requests += o.Requests
	c.Refused += o.Refused
	c.PromptTokens += o.PromptTokens
	c.CachedTokens += o.CachedTokens
	c.CompletionTokens += o.CompletionTokens
}

// UsageRow is what key KeyID of org OrgID used of model Model in the UTC hour starting at Hour.
type UsageRow struct {
	OrgID, KeyID, Model string
	Hour                time.Time
	UsageCounts
}

// UsageHour is the start of t's UTC hour: the hour usage at t is stored under.
func UsageHour(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// AddUsage adds rows to what the store holds for the hour of hour (UsageHour; the rows' own Hour is not
// read), in one transaction: a row's counts are added to the stored row of its org, key, model and hour,
// which it creates the first time. Gateways sharing the store add to the same rows. A row of an org the
// store no longer has is dropped: a deleted org's usage goes with it. A row without an org, key or model,
// or with a negative count, is ErrInvalid, with nothing added. Usage is not config: the generation stays.
func (s *Store) AddUsage(ctx context.Context, hour time.Time, rows []UsageRow) error {
	for _, r := range rows {
		if r.OrgID == "" || r.KeyID == "" || r.Model == "" {
			return fmt.Errorf("cannot add usage: %w: a row without an org, key or model (%q, %q, %q)", ErrInvalid, r.OrgID, r.KeyID, r.Model)
		}
		if r.Requests < 0 || r.Refused < 0 || r.PromptTokens < 0 || r.CachedTokens < 0 || r.CompletionTokens < 0 {
			return fmt.Errorf("cannot add usage: %w: key %q of org %q has a negative count for model %q", ErrInvalid, r.KeyID, r.OrgID, r.Model)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	h := UsageHour(hour).UnixMilli()
	sqlTx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("cannot add usage: %w", s.reach(err))
	}
	defer sqlTx.Rollback() // after Commit, a no-op
	tx := dbtx{sqlTx, s.pg != nil}
	// The casts type the selected values for PostgreSQL (else text); the WHERE also lets SQLite parse the upsert of an INSERT ... SELECT (its docs' "parsing ambiguity").
	const q = `INSERT INTO usage (org_id, key_id, model, hour, requests, refused, prompt_tokens, cached_tokens, completion_tokens)
		SELECT ?1, ?2, ?3, CAST(?4 AS BIGINT), CAST(?5 AS BIGINT), CAST(?6 AS BIGINT), CAST(?7 AS BIGINT), CAST(?8 AS BIGINT), CAST(?9 AS BIGINT) WHERE EXISTS (SELECT 1 FROM orgs WHERE id = ?1)
		ON CONFLICT (org_id, key_id, model, hour) DO UPDATE SET
			requests = usage.requests + excluded.requests,
			refused = usage.refused + excluded.refused,
			prompt_tokens = usage.prompt_tokens + excluded.prompt_tokens,
			cached_tokens = usage.cached_tokens + excluded.cached_tokens,
			completion_tokens = usage.completion_tokens + excluded.completion_tokens`
	for _, r := range rows {
		if _, err := tx.ExecContext(ctx, q, r.OrgID, r.KeyID, r.Model, h,
			r.Requests, r.Refused, r.PromptTokens, r.CachedTokens, r.CompletionTokens); err != nil {
			return fmt.Errorf("cannot add usage: %w", s.reach(err))
		}
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("cannot add usage: %w", s.reach(err))
	}
	return nil
}

// Usage returns the stored usage of org orgID ("" for every org) in the hours that start at or after from
// and before to, sorted by org, hour, key and model.
func (s *Store) Usage(ctx context.Context, orgID string, from, to time.Time) ([]UsageRow, error) {
	q := `SELECT org_id, key_id, model, hour, requests, refused, prompt_tokens, cached_tokens, completion_tokens
		FROM usage WHERE hour >= ? AND hour < ?`
	args := []any{from.UnixMilli(), to.UnixMilli()}
	if orgID != "" {
		q += " AND org_id = ?"
		args = append(args, orgID)
	}
	rows, err := s.pool().QueryContext(ctx, q+" ORDER BY org_id, hour, key_id, model", args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read usage: %w", s.reach(err))
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var r UsageRow
		var hour int64
		if err := rows.Scan(&r.OrgID, &r.KeyID, &r.Model, &hour, &r.Requests, &r.Refused, &r.PromptTokens, &r.CachedTokens, &r.CompletionTokens); err != nil {
			return nil, fmt.Errorf("cannot read usage: %w", s.reach(err))
		}
		r.Hour = time.UnixMilli(hour).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read usage: %w", s.reach(err))
	}
	return out, nil
}
