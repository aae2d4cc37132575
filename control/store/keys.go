package store

import (
	"context"
	"fmt"

	"github.com/rolter-ai/rolter/config"
)

// KeyHash is a valid data-plane key as the gateway needs it: the hash of its secret, its org, and its own
// limits (nil: its org's key default applies).
type KeyHash struct {
	Hash   [32]byte
	ID     string
	OrgID  string
	Limits *config.Limits
}

// CreateKey records a data-plane key of org orgID: hash is SHA-256(Pepper() || secret), prefix the
// secret's first characters for display, limits its own (nil for none: its org's key default applies).
// The store never sees the secret. A hash already used by a key or a token is ErrConflict; a missing org is
// ErrNotFound; limits that fail config.Limits.Check are ErrInvalid.
func (s *Store) CreateKey(ctx context.Context, actor, orgID, name string, hash [32]byte, prefix string, limits *config.Limits) (Credential, error) {
	k, err := keyTable.create(ctx, s, actor, orgID, name, hash, prefix, limits)
	if err != nil {
		return Credential{}, fmt.Errorf("cannot create key %q of org %q: %w", name, orgID, err)
	}
	return k, nil
}

// ListKeys returns the keys of org orgID, revoked ones included, oldest first.
func (s *Store) ListKeys(ctx context.Context, orgID string) ([]Credential, error) {
	ks, err := keyTable.list(ctx, s, orgID)
	if err != nil {
		return nil, fmt.Errorf("cannot list keys of org %q: %w", orgID, err)
	}
	return ks, nil
}

// RevokeKey revokes the key id of org orgID: ErrNotFound when org orgID has no such key, ErrConflict when
// it is revoked already.
func (s *Store) RevokeKey(ctx context.Context, actor, orgID, id string) error {
	if err := keyTable.revoke(ctx, s, actor, orgID, id); err != nil {
		return fmt.Errorf("cannot revoke key %q of org %q: %w", id, orgID, err)
	}
	return nil
}
