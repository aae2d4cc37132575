package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// Credential is a data-plane key or an org admin token as listed: never the secret, nor its hash.
type Credential struct {
	ID      string // "key_..." or "tok_...", chosen by the store
	OrgID   string
	Name    string
	Prefix  string // the first characters of the secret, for display
	Created time.Time
	Revoked time.Time // zero while the credential is valid
	// Limits are a key's own limits (nil: its org's key default applies); nil for a token.
	Limits *config.Limits
}

// credentials is what keys and tokens share.
type credentials struct {
	object   string // "key" or "token"
	table    string
	idPrefix string
	limits   bool // the table has a limits column (keys)
}

var (
	keyTable   = credentials{object: "key", table: "keys", idPrefix: "key_", limits: true}
	tokenTable = credentials{object: "token", table: "tokens", idPrefix: "tok_"}
)

// create records a credential; limits (nil for none) are a key's own, and a token has none.
func (c credentials) create(ctx context.Context, s *Store, actor, orgID, name string, hash [32]byte, prefix string, limits *config.Limits) (Credential, error) {
	if err := CheckName(c.object+" name", name, MaxNameLen); err != nil {
		return Credential{}, err
	}
	if err := CheckName(c.object+" prefix", prefix, maxPrefixLen); err != nil {
		return Credential{}, err
	}
	if limits != nil && !c.limits {
		return Credential{}, fmt.Errorf("BUG: a %s has no limits", c.object)
	}
	if err := checkLimits(map[string]*config.Limits{"limits": limits}); err != nil {
		return Credential{}, err
	}
	lv, err := encodeLimits(limits)
	if err != nil {
		return Credential{}, err
	}
	cr := Credential{ID: newID(c.idPrefix), OrgID: orgID, Name: name, Prefix: prefix, Limits: limits}
	err = s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return audit{}, err
		}
		// A secret is a key or a token, never both: the hash is unique across the two tables.
		var taken int
		if err := tx.QueryRowContext(ctx, "SELECT (SELECT count(*) FROM keys WHERE hash = ?1) + (SELECT count(*) FROM tokens WHERE hash = ?1)", hash[:]).Scan(&taken); err != nil {
			return audit{}, err
		}
		if taken > 0 {
			return audit{}, fmt.Errorf("%w: the hash is taken", ErrConflict)
		}
		cols, args := "id, org_id, name, hash, prefix, created", []any{cr.ID, orgID, name, hash[:], prefix, now}
		detail := fmt.Sprintf("name %q prefix %q", name, prefix)
		if c.limits {
			cols, args = cols+", limits", append(args, lv)
			if limits != nil {
				detail += " limits " + describeLimits(limits)
			}
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+c.table+" ("+cols+") VALUES (?"+strings.Repeat(", ?", len(args)-1)+")", args...); err != nil {
			return audit{}, err
		}
		cr.Created = millis(now)
		return audit{orgID: orgID, action: "create", object: c.object, name: cr.ID, detail: detail}, nil
	})
	return cr, err
}

func (c credentials) list(ctx context.Context, s *Store, orgID string) ([]Credential, error) {
	var out []Credential
	err := s.read(ctx, func(tx dbtx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		cols := "id, org_id, name, prefix, created, revoked"
		if c.limits {
			cols += ", limits"
		}
		rows, err := tx.QueryContext(ctx, "SELECT "+cols+" FROM "+c.table+" WHERE org_id = ? ORDER BY created, id", orgID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var cr Credential
			var created int64
			var revoked sql.NullInt64
			var limits sql.NullString
			dest := []any{&cr.ID, &cr.OrgID, &cr.Name, &cr.Prefix, &created, &revoked}
			if c.limits {
				dest = append(dest, &limits)
			}
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			var err error
			if cr.Limits, err = decodeLimits(fmt.Sprintf("%s %q", c.object, cr.ID), limits); err != nil {
				return err
			}
			cr.Created = millis(created)
			if revoked.Valid {
				cr.Revoked = millis(revoked.Int64)
			}
			out = append(out, cr)
		}
		return rows.Err()
	})
	return out, err
}

func (c credentials) revoke(ctx context.Context, s *Store, actor, orgID, id string) error {
	return s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var revoked sql.NullInt64
		var name string
		err := tx.QueryRowContext(ctx, "SELECT name, revoked FROM "+c.table+" WHERE id = ? AND org_id = ?", id, orgID).Scan(&name, &revoked)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, ErrNotFound
		}
		if err != nil {
			return audit{}, err
		}
		if revoked.Valid {
			return audit{}, fmt.Errorf("%w: revoked already, at %s", ErrConflict, millis(revoked.Int64).Format(time.RFC3339))
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+c.table+" SET revoked = ? WHERE id = ?", now, id); err != nil {
			return audit{}, err
		}
		return audit{orgID: orgID, action: "revoke", object: c.object, name: id, detail: fmt.Sprintf("name %q", name)}, nil
	})
}
