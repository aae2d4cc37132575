package store

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Route maps a public model name to an org's providers. Config is opaque JSON to the store.
type Route struct {
	OrgID   string
	Model   string // unique across all orgs: the public model names are one namespace
	Config  json.RawMessage
	Version int64 // 1 when created, +1 on each replace
	Created time.Time
	Updated time.Time
}

func (r row) route() Route {
	return Route{OrgID: r.orgID, Model: r.name, Config: r.config, Version: r.version, Created: millis(r.created), Updated: millis(r.updated)}
}

// PutRoute creates or replaces the route of the public model name model for org orgID, as PutProvider
// does providers. A model any other org routes is ErrConflict.
func (s *Store) PutRoute(ctx context.Context, actor, orgID, model string, config []byte, expectVersion int64) (created bool, version int64, err error) {
	if expectVersion < 0 {
		return false, 0, fmt.Errorf("cannot put route %q of org %q: %w: expected version %d", model, orgID, ErrInvalid, expectVersion)
	}
	r, err := s.putVersioned(ctx, routeTable, actor, orgID, model, config, expectVersion)
	if err != nil {
		return false, 0, fmt.Errorf("cannot put route %q of org %q: %w", model, orgID, err)
	}
	return r.version == 1, r.version, nil
}

// CreateRoute creates the route of model for org orgID at version 1; a model already routed, by this org
// or any other, is ErrConflict.
func (s *Store) CreateRoute(ctx context.Context, actor, orgID, model string, config []byte) error {
	if _, err := s.putVersioned(ctx, routeTable, actor, orgID, model, config, CreateOnly); err != nil {
		return fmt.Errorf("cannot create route %q of org %q: %w", model, orgID, err)
	}
	return nil
}

// GetRoute returns org orgID's route of model, or ErrNotFound (also when another org routes model).
func (s *Store) GetRoute(ctx context.Context, orgID, model string) (Route, error) {
	rs, err := routeTable.list(ctx, s.pool(), "WHERE org_id = ? AND model = ?", orgID, model)
	if err == nil && len(rs) == 0 {
		err = ErrNotFound
	}
	err = s.reach(err)
	if err != nil {
		return Route{}, fmt.Errorf("cannot get route %q of org %q: %w", model, orgID, err)
	}
	return rs[0].route(), nil
}

// ListRoutes returns the routes of org orgID sorted by model; a missing org is ErrNotFound.
func (s *Store) ListRoutes(ctx context.Context, orgID string) ([]Route, error) {
	var out []Route
	err := s.read(ctx, func(tx dbtx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		rs, err := routeTable.list(ctx, tx, "WHERE org_id = ? ORDER BY model", orgID)
		for _, r := range rs {
			out = append(out, r.route())
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list routes of org %q: %w", orgID, err)
	}
	return out, nil
}

// DeleteRoute deletes org orgID's route of model, as DeleteProvider does providers.
func (s *Store) DeleteRoute(ctx context.Context, actor, orgID, model string, expectVersion int64) error {
	if err := s.deleteVersioned(ctx, routeTable, actor, orgID, model, expectVersion); err != nil {
		return fmt.Errorf("cannot delete route %q of org %q: %w", model, orgID, err)
	}
	return nil
}

// WriteRoute is PutRoute returning the route as written, or CreateRoute with expectVersion CreateOnly: what the API
// answers, even when another gateway replaces it right after.
func (s *Store) WriteRoute(ctx context.Context, actor, orgID, model string, config []byte, expectVersion int64) (Route, error) {
	r, err := s.putObject(ctx, routeTable, actor, orgID, model, config, expectVersion)
	if err != nil {
		return Route{}, err
	}
	return r.route(), nil
}
