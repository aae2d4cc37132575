package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// CreateToken records an admin token of org orgID, as CreateKey does keys.
func (s *Store) CreateToken(ctx context.Context, actor, orgID, name string, hash [32]byte, prefix string) (Credential, error) {
	t, err := tokenTable.create(ctx, s, actor, orgID, name, hash, prefix, nil)
	if err != nil {
		return Credential{}, fmt.Errorf("cannot create token %q of org %q: %w", name, orgID, err)
	}
	return t, nil
}

// ListTokens returns the admin tokens of org orgID, revoked ones included, oldest first.
func (s *Store) ListTokens(ctx context.Context, orgID string) ([]Credential, error) {
	ts, err := tokenTable.list(ctx, s, orgID)
	if err != nil {
		return nil, fmt.Errorf("cannot list tokens of org %q: %w", orgID, err)
	}
	return ts, nil
}

// RevokeToken revokes the admin token id of org orgID, as RevokeKey does keys.
func (s *Store) RevokeToken(ctx context.Context, actor, orgID, id string) error {
	if err := tokenTable.revoke(ctx, s, actor, orgID, id); err != nil {
		return fmt.Errorf("cannot revoke token %q of org %q: %w", id, orgID, err)
	}
	return nil
}

// TokenByHash returns the org and id of the valid (not revoked) admin token whose hash is hash; ok is
// false when there is none.
func (s *Store) TokenByHash(ctx context.Context, hash [32]byte) (orgID, id string, ok bool, err error) {
	err = s.pool().QueryRowContext(ctx, "SELECT org_id, id FROM tokens WHERE hash = ? AND revoked IS NULL", hash[:]).Scan(&orgID, &id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("cannot look up a token: %w", s.reach(err))
	}
	return orgID, id, true, nil
}
