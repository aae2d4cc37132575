package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Org is a tenant: providers, routes, keys and tokens belong to one.
type Org struct {
	ID      string // "org_" and 12 base32 characters, chosen by the store
	Name    string // unique across orgs
	Created time.Time
}

// orgExists fails with ErrNotFound when orgID is not an org.
func orgExists(ctx context.Context, tx dbtx, orgID string) error {
	var one int
	err := tx.QueryRowContext(ctx, "SELECT 1 FROM orgs WHERE id = ?", orgID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: no org %q", ErrNotFound, orgID)
	}
	return err
}

// CreateOrg creates an org named name. A name already taken fails with ErrConflict.
func (s *Store) CreateOrg(ctx context.Context, actor, name string) (Org, error) {
	o := Org{ID: newID("org_"), Name: name}
	if err := CheckName("org name", name, MaxNameLen); err != nil {
		return Org{}, fmt.Errorf("cannot create org %q: %w", name, err)
	}
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var id string
		err := tx.QueryRowContext(ctx, "SELECT id FROM orgs WHERE name = ?", name).Scan(&id)
		if err == nil {
			return audit{}, fmt.Errorf("%w: the name is taken by org %q", ErrConflict, id)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return audit{}, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO orgs (id, name, created) VALUES (?, ?, ?)", o.ID, name, now); err != nil {
			return audit{}, err
		}
		o.Created = millis(now)
		return audit{orgID: o.ID, action: "create", object: "org", name: name, detail: o.ID}, nil
	})
	if err != nil {
		return Org{}, fmt.Errorf("cannot create org %q: %w", name, err)
	}
	return o, nil
}

// GetOrg returns the org orgID, or ErrNotFound.
func (s *Store) GetOrg(ctx context.Context, orgID string) (Org, error) {
	var o Org
	var created int64
	err := s.pool().QueryRowContext(ctx, "SELECT id, name, created FROM orgs WHERE id = ?", orgID).Scan(&o.ID, &o.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	err = s.reach(err)
	if err != nil {
		return Org{}, fmt.Errorf("cannot get org %q: %w", orgID, err)
	}
	o.Created = millis(created)
	return o, nil
}

// ListOrgs returns every org, sorted by name.
func (s *Store) ListOrgs(ctx context.Context) ([]Org, error) {
	var orgs []Org
	err := s.read(ctx, func(tx dbtx) error {
		var err error
		orgs, err = listOrgs(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list orgs: %w", err)
	}
	return orgs, nil
}

func listOrgs(ctx context.Context, tx dbtx) ([]Org, error) {
	rows, err := tx.QueryContext(ctx, "SELECT id, name, created FROM orgs ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var orgs []Org
	for rows.Next() {
		var o Org
		var created int64
		if err := rows.Scan(&o.ID, &o.Name, &created); err != nil {
			return nil, err
		}
		o.Created = millis(created)
		orgs = append(orgs, o)
	}
	return orgs, rows.Err()
}

// DeleteOrg deletes the org orgID with its providers, routes, keys and tokens. Its audit rows stay.
func (s *Store) DeleteOrg(ctx context.Context, actor, orgID string) error {
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var name string
		var providers, routes, keys, tokens int
		err := tx.QueryRowContext(ctx, `SELECT name,
			(SELECT count(*) FROM providers WHERE org_id = orgs.id),
			(SELECT count(*) FROM routes WHERE org_id = orgs.id),
			(SELECT count(*) FROM keys WHERE org_id = orgs.id),
			(SELECT count(*) FROM tokens WHERE org_id = orgs.id)
			FROM orgs WHERE id = ?`, orgID).Scan(&name, &providers, &routes, &keys, &tokens)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, ErrNotFound
		}
		if err != nil {
			return audit{}, err
		}
		// The foreign keys' ON DELETE CASCADE deletes the rest.
		if _, err := tx.ExecContext(ctx, "DELETE FROM orgs WHERE id = ?", orgID); err != nil {
			return audit{}, err
		}
		detail := fmt.Sprintf("%s with providers %d, routes %d, keys %d, tokens %d", orgID, providers, routes, keys, tokens)
		return audit{orgID: orgID, action: "delete", object: "org", name: name, detail: detail}, nil
	})
	if err != nil {
		return fmt.Errorf("cannot delete org %q: %w", orgID, err)
	}
	return nil
}
