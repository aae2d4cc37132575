package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Provider is an org's upstream definition. Config is opaque JSON to the store.
type Provider struct {
	OrgID   string
	Name    string // unique within the org
	Config  json.RawMessage
	Version int64 // 1 when created, +1 on each replace
	Created time.Time
	Updated time.Time
}

func (r row) provider() Provider {
	return Provider{OrgID: r.orgID, Name: r.name, Config: r.config, Version: r.version, Created: millis(r.created), Updated: millis(r.updated)}
}

// PutProvider creates or replaces the provider name of org orgID. With expectVersion 0 it creates or
// replaces whatever is stored; with expectVersion > 0 it replaces only a stored version expectVersion and
// fails otherwise with a *VersionConflictError (Current 0 when there is none). It returns whether the
// provider was created and its new version. A missing org is ErrNotFound.
func (s *Store) PutProvider(ctx context.Context, actor, orgID, name string, config []byte, expectVersion int64) (created bool, version int64, err error) {
	if expectVersion < 0 {
		return false, 0, fmt.Errorf("cannot put provider %q of org %q: %w: expected version %d", name, orgID, ErrInvalid, expectVersion)
	}
	r, err := s.putVersioned(ctx, providerTable, actor, orgID, name, config, expectVersion)
	if err != nil {
		return false, 0, fmt.Errorf("cannot put provider %q of org %q: %w", name, orgID, err)
	}
	return r.version == 1, r.version, nil
}

// CreateProvider creates the provider name of org orgID at version 1; one that exists is ErrConflict.
func (s *Store) CreateProvider(ctx context.Context, actor, orgID, name string, config []byte) error {
	if _, err := s.putVersioned(ctx, providerTable, actor, orgID, name, config, CreateOnly); err != nil {
		return fmt.Errorf("cannot create provider %q of org %q: %w", name, orgID, err)
	}
	return nil
}

// GetProvider returns the provider name of org orgID, or ErrNotFound. Its Config is the caller's.
func (s *Store) GetProvider(ctx context.Context, orgID, name string) (Provider, error) {
	rs, err := providerTable.list(ctx, s.pool(), "WHERE org_id = ? AND name = ?", orgID, name)
	if err == nil && len(rs) == 0 {
		err = ErrNotFound
	}
	err = s.reach(err)
	if err != nil {
		return Provider{}, fmt.Errorf("cannot get provider %q of org %q: %w", name, orgID, err)
	}
	return rs[0].provider(), nil
}

// ListProviders returns the providers of org orgID sorted by name; a missing org is ErrNotFound.
func (s *Store) ListProviders(ctx context.Context, orgID string) ([]Provider, error) {
	var ps []Provider
	err := s.read(ctx, func(tx dbtx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		rs, err := providerTable.list(ctx, tx, "WHERE org_id = ? ORDER BY name", orgID)
		for _, r := range rs {
			ps = append(ps, r.provider())
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list providers of org %q: %w", orgID, err)
	}
	return ps, nil
}

// DeleteProvider deletes the provider name of org orgID: any version with expectVersion 0, only version
// expectVersion otherwise (else a *VersionConflictError). A missing provider is ErrNotFound with
// expectVersion 0.
func (s *Store) DeleteProvider(ctx context.Context, actor, orgID, name string, expectVersion int64) error {
	err := s.deleteVersioned(ctx, providerTable, actor, orgID, name, expectVersion)
	if err != nil {
		return fmt.Errorf("cannot delete provider %q of org %q: %w", name, orgID, err)
	}
	return nil
}

// WriteProvider is PutProvider returning the provider as written, or CreateProvider with expectVersion CreateOnly: what the API
// answers, even when another gateway replaces it right after.
func (s *Store) WriteProvider(ctx context.Context, actor, orgID, name string, config []byte, expectVersion int64) (Provider, error) {
	r, err := s.putObject(ctx, providerTable, actor, orgID, name, config, expectVersion)
	if err != nil {
		return Provider{}, err
	}
	return r.provider(), nil
}
