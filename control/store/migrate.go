package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
)

//go:embed migrations/*.sql migrations/postgres/*.sql
var migrationFiles embed.FS

// migration is one embedded migrations/NNNN_name.sql file.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations are the embedded schema migrations, in order: migrations[i].version == i+1. pgMigrations are
// the same migrations in PostgreSQL's SQL (migrations/postgres), one for one.
var (
	migrations   = mustMigrations(migrationFiles, "migrations")
	pgMigrations = mustMigrations(migrationFiles, "migrations/postgres")
)

// SchemaVersion returns the newest schema version this binary knows; a store with a newer one is refused.
func SchemaVersion() int { return len(migrations) }

var migrationName = regexp.MustCompile(`^([0-9]{4})_[a-z0-9_]+\.sql$`)

func mustMigrations(fsys fs.FS, dir string) []migration {
	ms, err := loadMigrations(fsys, dir)
	if err != nil {
		panic("BUG: " + err.Error())
	}
	return ms
}

// loadMigrations reads the dir/*.sql files of fsys, which must be numbered 0001, 0002, ... without gaps.
func loadMigrations(fsys fs.FS, dir string) ([]migration, error) {
	names, err := fs.Glob(fsys, dir+"/*.sql")
	if err != nil {
		return nil, fmt.Errorf("cannot list migrations: %w", err)
	}
	sort.Strings(names)
	var ms []migration
	for i, p := range names {
		base := filepath.Base(p)
		m := migrationName.FindStringSubmatch(base)
		if m == nil {
			return nil, fmt.Errorf("cannot load migration %q: the name is not NNNN_name.sql", base)
		}
		if v, _ := strconv.Atoi(m[1]); v != i+1 {
			return nil, fmt.Errorf("cannot load migration %q: want version %04d here", base, i+1)
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("cannot load migration %q: %w", base, err)
		}
		ms = append(ms, migration{version: i + 1, name: base, sql: string(b)})
	}
	if len(ms) == 0 {
		return nil, errors.New("cannot load migrations: there are none")
	}
	return ms, nil
}

// newerSchemaError refuses a store migrated by a newer rolter: its schema may mean what this binary cannot
// know, and migrations only go up.
type newerSchemaError struct {
	path           string
	version, known int
}

func (e *newerSchemaError) Error() string {
	return fmt.Sprintf("store %s has schema version %d; this rolter knows up to %d: upgrade rolter, never downgrade a store", e.path, e.version, e.known)
}

// migrate applies the migrations after the store's version, each in its own transaction with the
// user_version it reaches, so a store is always at exactly one version of ms.
func migrate(ctx context.Context, conn *sql.Conn, ms []migration) error {
	for _, m := range ms {
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("cannot apply migration %q: %w", m.name, err)
		}
		var v int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
			tx.Rollback()
			return fmt.Errorf("cannot apply migration %q: %w", m.name, err)
		}
		if v >= m.version { // applied earlier, or meanwhile by another process
			tx.Rollback()
			continue
		}
		if v != m.version-1 {
			tx.Rollback()
			return fmt.Errorf("BUG: cannot apply migration %q to schema version %d", m.name, v)
		}
		if _, err := tx.ExecContext(ctx, m.sql); err != nil {
			tx.Rollback()
			return fmt.Errorf("cannot apply migration %q: %w", m.name, err)
		}
		// PRAGMA takes no parameters; m.version is an int.
		if _, err := tx.ExecContext(ctx, "PRAGMA user_version = "+strconv.Itoa(m.version)); err != nil {
			tx.Rollback()
			return fmt.Errorf("cannot apply migration %q: %w", m.name, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("cannot apply migration %q: %w", m.name, err)
		}
	}
	return nil
}
