package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// AuditEntry is one write of the store.
type AuditEntry struct {
	ID         int64 // increasing
	At         time.Time
	Generation int64  // the generation the write produced
	Actor      string // "superadmin" or a token id
	OrgID      string // the org written to
	Action     string // "create", "replace", "delete" or "revoke"
	Object     string // "org", "provider", "route", "key", "token" or "secret"
	Name       string // the object's name: org name, provider name, model, key or token id
	Detail     string // e.g. "version 3"
}

// audit is the audit row of a write, without its time, actor and generation.
type audit struct {
	orgID, action, object, name, detail string
}

// Audit returns at most limit (> 0) audit entries, newest first: those of org orgID, or all with orgID "".
func (s *Store) Audit(ctx context.Context, orgID string, limit int) ([]AuditEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("cannot read the audit log: %w: limit %d", ErrInvalid, limit)
	}
	q := "SELECT id, at, generation, actor, org_id, action, object, name, detail FROM audit"
	args := []any{}
	if orgID != "" {
		q += " WHERE org_id = ?"
		args = append(args, orgID)
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, limit)
	rows, err := s.pool().QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var at int64
		var org sql.NullString
		if err := rows.Scan(&e.ID, &at, &e.Generation, &e.Actor, &org, &e.Action, &e.Object, &e.Name, &e.Detail); err != nil {
			return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
		}
		e.At, e.OrgID = millis(at), org.String
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
	}
	return out, nil
}
