package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/rolter-ai/rolter/config"
)

// OrgLimits are the limits the control plane set on org OrgID: its own (Org) and the default of its keys
// that have none of their own (Keys), each nil for none, when rolter.toml's [limits] applies.
type OrgLimits struct {
	OrgID string
	Org   *config.Limits
	Keys  *config.Limits
}

// checkLimits refuses limits that fail config.Limits.Check: one ErrInvalid error with the problems of
// each, prefixed by its field ("limits", "key_limits"). A nil limits has none.
func checkLimits(fields map[string]*config.Limits) error {
	var msgs []string
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		if l := fields[f]; l != nil {
			msgs = append(msgs, l.Check(f)...)
		}
	}
	if len(msgs) > 0 {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(msgs, "; "))
	}
	return nil
}

// encodeLimits is the column value of l: its JSON, or NULL for nil.
func encodeLimits(l *config.Limits) (sql.NullString, error) {
	if l == nil {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(l)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("BUG: cannot encode limits: %w", err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// decodeLimits reads a limits column of what ("key \"key_...\"", say): nil for NULL. Limits that do not
// decode or do not pass their check are an error: the store writes only checked ones.
func decodeLimits(what string, v sql.NullString) (*config.Limits, error) {
	if !v.Valid {
		return nil, nil
	}
	var l config.Limits
	dec := json.NewDecoder(strings.NewReader(v.String))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("the stored limits of %s do not decode: %w", what, err)
	}
	if msgs := l.Check("limits"); len(msgs) > 0 {
		return nil, fmt.Errorf("the stored limits of %s are invalid: %s", what, strings.Join(msgs, "; "))
	}
	return &l, nil
}

// describeLimits is l as the audit log shows it: its JSON, or "none".
func describeLimits(l *config.Limits) string {
	v, err := encodeLimits(l)
	if err != nil || !v.Valid {
		return "none"
	}
	return v.String
}

// SetOrgLimits sets the limits of org orgID: its own (org) and the default of its keys that have none of
// their own (keys); nil for none, when rolter.toml's [limits] applies. Limits that fail
// config.Limits.Check are ErrInvalid, a missing org ErrNotFound.
func (s *Store) SetOrgLimits(ctx context.Context, actor, orgID string, org, keys *config.Limits) error {
	if err := checkLimits(map[string]*config.Limits{"limits": org, "key_limits": keys}); err != nil {
		return fmt.Errorf("cannot set the limits of org %q: %w", orgID, err)
	}
	ov, err := encodeLimits(org)
	if err != nil {
		return err
	}
	kv, err := encodeLimits(keys)
	if err != nil {
		return err
	}
	err = s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var name string
		err := tx.QueryRowContext(ctx, "SELECT name FROM orgs WHERE id = ?", orgID).Scan(&name)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, fmt.Errorf("%w: no org %q", ErrNotFound, orgID)
		}
		if err != nil {
			return audit{}, err
		}
		if _, err := tx.ExecContext(ctx, "UPDATE orgs SET limits = ?, key_limits = ? WHERE id = ?", ov, kv, orgID); err != nil {
			return audit{}, err
		}
		detail := fmt.Sprintf("limits %s, key limits %s", describeLimits(org), describeLimits(keys))
		return audit{orgID: orgID, action: "replace", object: "org", name: name, detail: detail}, nil
	})
	if err != nil {
		return fmt.Errorf("cannot set the limits of org %q: %w", orgID, err)
	}
	return nil
}

// GetOrgLimits returns the limits of org orgID, or ErrNotFound.
func (s *Store) GetOrgLimits(ctx context.Context, orgID string) (OrgLimits, error) {
	var ov, kv sql.NullString
	err := s.pool().QueryRowContext(ctx, "SELECT limits, key_limits FROM orgs WHERE id = ?", orgID).Scan(&ov, &kv)
	if errors.Is(err, sql.ErrNoRows) {
		err = fmt.Errorf("%w: no org %q", ErrNotFound, orgID)
	}
	if err != nil {
		return OrgLimits{}, fmt.Errorf("cannot get the limits of org %q: %w", orgID, s.reach(err))
	}
	ol, err := orgLimits(orgID, ov, kv)
	if err != nil {
		return OrgLimits{}, fmt.Errorf("cannot get the limits of org %q: %w", orgID, err)
	}
	return ol, nil
}

func orgLimits(orgID string, ov, kv sql.NullString) (OrgLimits, error) {
	ol := OrgLimits{OrgID: orgID}
	var err error
	if ol.Org, err = decodeLimits(fmt.Sprintf("org %q", orgID), ov); err != nil {
		return OrgLimits{}, err
	}
	if ol.Keys, err = decodeLimits(fmt.Sprintf("the keys of org %q", orgID), kv); err != nil {
		return OrgLimits{}, err
	}
	return ol, nil
}

// loadOrgLimits returns the limits of the orgs that have any of their own, by org id.
func loadOrgLimits(ctx context.Context, tx dbtx) ([]OrgLimits, error) {
	rows, err := tx.QueryContext(ctx, "SELECT id, limits, key_limits FROM orgs WHERE limits IS NOT NULL OR key_limits IS NOT NULL ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OrgLimits
	for rows.Next() {
		var id string
		var ov, kv sql.NullString
		if err := rows.Scan(&id, &ov, &kv); err != nil {
			return nil, err
		}
		ol, err := orgLimits(id, ov, kv)
		if err != nil {
			return nil, err
		}
		out = append(out, ol)
	}
	return out, rows.Err()
}

// SetKeyLimits sets the own limits of key keyID of org orgID; nil for none, when its org's key default
// applies. Limits that fail config.Limits.Check are ErrInvalid; ErrNotFound when org orgID has no such key,
// ErrConflict when it is revoked.
func (s *Store) SetKeyLimits(ctx context.Context, actor, orgID, keyID string, l *config.Limits) error {
	if err := checkLimits(map[string]*config.Limits{"limits": l}); err != nil {
		return fmt.Errorf("cannot set the limits of key %q of org %q: %w", keyID, orgID, err)
	}
	v, err := encodeLimits(l)
	if err != nil {
		return err
	}
	err = s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var revoked sql.NullInt64
		err := tx.QueryRowContext(ctx, "SELECT revoked FROM keys WHERE id = ? AND org_id = ?", keyID, orgID).Scan(&revoked)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, fmt.Errorf("%w: org %q has no key %q", ErrNotFound, orgID, keyID)
		}
		if err != nil {
			return audit{}, err
		}
		if revoked.Valid {
			return audit{}, fmt.Errorf("%w: the key is revoked", ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, "UPDATE keys SET limits = ? WHERE id = ?", v, keyID); err != nil {
			return audit{}, err
		}
		return audit{orgID: orgID, action: "replace", object: "key", name: keyID, detail: "limits " + describeLimits(l)}, nil
	})
	if err != nil {
		return fmt.Errorf("cannot set the limits of key %q of org %q: %w", keyID, orgID, err)
	}
	return nil
}
