package store

import (
	"context"
	"database/sql"
	"fmt"
)

// State is everything the gateway needs, read in one transaction: a consistent snapshot at Generation.
// Orgs are sorted by name, providers by org and name, routes by model, keys by org and id, org limits by
// org id.
type State struct {
	Generation int64
	Pepper     [32]byte
	Orgs       []Org
	Providers  []Provider
	Routes     []Route
	Keys       []KeyHash // the non-revoked ones
	// OrgLimits are the limits of the orgs that set any of their own, sorted by org id.
	OrgLimits []OrgLimits
	// Secrets are the orgs' secrets, decrypted, sorted by org and name: only Compose reads them.
	Secrets []SecretValue
}

// Load returns everything the gateway needs, read in one transaction. The State is the caller's.
func (s *Store) Load(ctx context.Context) (*State, error) {
	st := &State{Pepper: s.pepper}
	err := s.read(ctx, func(tx dbtx) error {
		if err := tx.QueryRowContext(ctx, "SELECT generation FROM meta WHERE id = 1").Scan(&st.Generation); err != nil {
			return err
		}
		var err error
		if st.Orgs, err = listOrgs(ctx, tx); err != nil {
			return err
		}
		ps, err := providerTable.list(ctx, tx, "ORDER BY org_id, name")
		if err != nil {
			return err
		}
		for _, r := range ps {
			st.Providers = append(st.Providers, r.provider())
		}
		rs, err := routeTable.list(ctx, tx, "ORDER BY model")
		if err != nil {
			return err
		}
		for _, r := range rs {
			st.Routes = append(st.Routes, r.route())
		}
		if st.Secrets, err = s.loadSecrets(ctx, tx); err != nil {
			return err
		}
		if st.OrgLimits, err = loadOrgLimits(ctx, tx); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT hash, id, org_id, limits FROM keys WHERE revoked IS NULL ORDER BY org_id, id")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k KeyHash
			var hash []byte
			var limits sql.NullString
			if err := rows.Scan(&hash, &k.ID, &k.OrgID, &limits); err != nil {
				return err
			}
			if k.Limits, err = decodeLimits(fmt.Sprintf("key %q", k.ID), limits); err != nil {
				return err
			}
			if len(hash) != len(k.Hash) {
				return fmt.Errorf("BUG: key %q has a %d-byte hash", k.ID, len(hash))
			}
			copy(k.Hash[:], hash)
			st.Keys = append(st.Keys, k)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("cannot load the store: %w", err)
	}
	return st, nil
}
