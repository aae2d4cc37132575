package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// versioned is what providers and routes share: a JSON config with a version, in a table keyed by
// (org_id, name) for providers and by model alone for routes.
type versioned struct {
	object string // "provider" or "route"
	table  string
	key    string // the name column
	global bool   // key is unique across orgs, not within one
}

var (
	providerTable = versioned{object: "provider", table: "providers", key: "name"}
	routeTable    = versioned{object: "route", table: "routes", key: "model", global: true}
)

// CreateOnly is the expected version that only creates (CreateProvider, CreateRoute, and WriteProvider and
// WriteRoute given it): it fails if the object exists.
const CreateOnly = -1

// put creates or replaces (orgID, name): only creates with expect CreateOnly, creates or replaces with 0,
// replaces version expect with expect > 0. It returns the row as written (version 1: created).
func (v versioned) put(ctx context.Context, tx dbtx, now int64, orgID, name string, config []byte, expect int64) (row, audit, error) {
	if err := orgExists(ctx, tx, orgID); err != nil {
		return row{}, audit{}, err
	}
	q, args := "SELECT org_id, version, created FROM "+v.table+" WHERE org_id = ? AND "+v.key+" = ?", []any{orgID, name}
	if v.global {
		q, args = "SELECT org_id, version, created FROM "+v.table+" WHERE "+v.key+" = ?", []any{name}
	}
	var owner string
	var current, created int64
	err := tx.QueryRowContext(ctx, q, args...).Scan(&owner, &current, &created)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		current = 0
	case err != nil:
		return row{}, audit{}, err
	case owner != orgID:
		// Not which org: an org admin learns that the name is taken, not who has it.
		return row{}, audit{}, fmt.Errorf("%w: %s %q is used by another org", ErrConflict, v.key, name)
	}
	switch {
	case expect == CreateOnly && current != 0:
		return row{}, audit{}, fmt.Errorf("%w: it exists (version %d)", ErrConflict, current)
	case expect > 0 && current != expect:
		return row{}, audit{}, &VersionConflictError{Expected: expect, Current: current}
	}
	a := audit{orgID: orgID, object: v.object, name: name}
	r := row{orgID: orgID, name: name, config: config, version: current + 1, created: created, updated: now}
	if current == 0 {
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+v.table+" (org_id, "+v.key+", config, version, created, updated) VALUES (?, ?, ?, 1, ?, ?)",
			orgID, name, config, now, now); err != nil {
			return row{}, audit{}, err
		}
		a.action, a.detail = "create", "version 1"
		r.created = now
		return r, a, nil
	}
	if _, err := tx.ExecContext(ctx, "UPDATE "+v.table+" SET config = ?, version = ?, updated = ? WHERE org_id = ? AND "+v.key+" = ?",
		config, current+1, now, orgID, name); err != nil {
		return row{}, audit{}, err
	}
	a.action, a.detail = "replace", "version "+strconv.FormatInt(current+1, 10)
	return r, a, nil
}

func (v versioned) delete(ctx context.Context, tx dbtx, orgID, name string, expect int64) (audit, error) {
	var current int64
	err := tx.QueryRowContext(ctx, "SELECT version FROM "+v.table+" WHERE org_id = ? AND "+v.key+" = ?", orgID, name).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		if expect > 0 {
			return audit{}, &VersionConflictError{Expected: expect, Current: 0}
		}
		return audit{}, ErrNotFound
	}
	if err != nil {
		return audit{}, err
	}
	if expect > 0 && current != expect {
		return audit{}, &VersionConflictError{Expected: expect, Current: current}
	}
	if _, err := tx.ExecContext(ctx, "DELETE FROM "+v.table+" WHERE org_id = ? AND "+v.key+" = ?", orgID, name); err != nil {
		return audit{}, err
	}
	return audit{orgID: orgID, action: "delete", object: v.object, name: name, detail: "version " + strconv.FormatInt(current, 10)}, nil
}

// row is a provider or a route as read.
type row struct {
	orgID, name      string
	config           []byte
	version          int64
	created, updated int64
}

func (v versioned) list(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, where string, args ...any) ([]row, error) {
	rows, err := q.QueryContext(ctx, "SELECT org_id, "+v.key+", config, version, created, updated FROM "+v.table+" "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var rs []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.orgID, &r.name, &r.config, &r.version, &r.created, &r.updated); err != nil {
			return nil, err
		}
		rs = append(rs, r)
	}
	return rs, rows.Err()
}

// putVersioned writes v's (orgID, name) as put does and returns the row as written; its config is config.
func (s *Store) putVersioned(ctx context.Context, v versioned, actor, orgID, name string, config []byte, expect int64) (row, error) {
	if err := CheckName(v.object+" "+v.key, name, MaxNameLen); err != nil {
		return row{}, err
	}
	if err := checkConfig(config); err != nil {
		return row{}, err
	}
	var r row
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var a audit
		var err error
		r, a, err = v.put(ctx, tx, now, orgID, name, config, expect)
		return a, err
	})
	return r, err
}

// putObject is PutProvider, CreateProvider with expect CreateOnly, or the same for routes (v), returning
// the row as written (WriteProvider, WriteRoute).
func (s *Store) putObject(ctx context.Context, v versioned, actor, orgID, name string, config []byte, expect int64) (row, error) {
	r, err := s.putVersioned(ctx, v, actor, orgID, name, config, expect)
	if err != nil {
		return row{}, fmt.Errorf("cannot put %s %q of org %q: %w", v.object, name, orgID, err)
	}
	return r, nil
}

func (s *Store) deleteVersioned(ctx context.Context, v versioned, actor, orgID, name string, expect int64) error {
	if expect < 0 {
		return fmt.Errorf("%w: expected version %d", ErrInvalid, expect)
	}
	return s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		return v.delete(ctx, tx, orgID, name, expect)
	})
}
