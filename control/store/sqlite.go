package store

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver: pure Go, so CGO_ENABLED=0 builds keep the store
)

// applicationID marks a rolter store in the SQLite header ("rolt"); set by 0001_init.sql.
const applicationID = 0x726f6c74

// sqliteMagic starts every SQLite 3 database file (https://www.sqlite.org/fileformat2.html, 1.3).
const sqliteMagic = "SQLite format 3\x00"

func open(ctx context.Context, path string, ms []migration) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open store %q: %w", path, err)
	}
	if err := prepareFile(abs); err != nil {
		return nil, fmt.Errorf("cannot open store %q: %w", path, err)
	}
	// mode=rw: SQLite never creates the file (prepareFile did, with our permissions). Per-connection
	// settings are in the name so that every connection the pool opens has them: synchronous=FULL syncs the
	// WAL on every commit (durable once Commit returns), _txlock=immediate takes the write lock at BEGIN so
	// that a write transaction never fails half-way on a lock upgrade, and waits up to busy_timeout for a
	// writer of another process.
	u := url.URL{Scheme: "file", Path: abs, RawQuery: "mode=rw&_busy_timeout=10000&_foreign_keys=1&_synchronous=FULL&_txlock=immediate"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return nil, fmt.Errorf("cannot open store %q: %w", path, err)
	}
	// One connection: the control plane is not hot, and it makes every call's view trivially consistent.
	db.SetMaxOpenConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)
	s := &Store{path: abs, db: db, now: time.Now}
	if err := s.init(ctx, ms); err != nil {
		db.Close()
		var newer *newerSchemaError
		if errors.As(err, &newer) {
			return nil, err // names the store already
		}
		return nil, fmt.Errorf("cannot open store %q: %w", path, err)
	}
	return s, nil
}

// prepareFile creates a missing store file with mode 0600 (and syncs its directory), and refuses an
// existing file that cannot be a SQLite database, before SQLite sees it.
func prepareFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		// A log without its database is what is left of a store whose file was removed: creating a new one
		// beside it would let SQLite read that log into an empty database, or lose it.
		for _, side := range []string{"-wal", "-journal"} {
			if _, err := os.Lstat(path + side); err == nil {
				return fmt.Errorf("the file is missing but %q exists: restore the store file or remove the log", path+side)
			}
		}
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return prepareFile(path) // created meanwhile by another process: check it as any existing file
		}
		if err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		return syncDir(filepath.Dir(path))
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s)", st.Mode())
	}
	var hdr [100]byte
	n, err := io.ReadFull(f, hdr[:])
	switch {
	case n == 0 && st.Size() == 0:
		return nil // created by an Open that stopped before SQLite wrote to it: a new store
	case err != nil && !errors.Is(err, io.ErrUnexpectedEOF):
		return err
	case !bytes.HasPrefix(hdr[:n], []byte(sqliteMagic)):
		return fmt.Errorf("not a SQLite database (the file starts with %q); refusing to touch it", hdr[:min(n, len(sqliteMagic))])
	case n < len(hdr):
		return fmt.Errorf("not a SQLite database (%d bytes, shorter than the header); refusing to touch it", n)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// corruptHint ends the errors of a file SQLite cannot read, or that fails its integrity check.
const corruptHint = "; the file was left as it is: restore it from a backup"

// init checks the database, migrates it, and reads (or creates) the pepper. It writes nothing before the
// checks have passed.
func (s *Store) init(ctx context.Context, ms []migration) error {
	// Connecting runs the per-connection PRAGMAs, which read the schema: a damaged file fails here already.
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("cannot read the database: %w"+corruptHint, err)
	}
	defer conn.Close()
	var version, appID int
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("cannot read the schema version: %w"+corruptHint, err)
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return fmt.Errorf("cannot read the application id: %w"+corruptHint, err)
	}
	if version > len(ms) {
		return &newerSchemaError{path: s.path, version: version, known: len(ms)}
	}
	if err := quickCheck(ctx, conn); err != nil {
		return err
	}
	if version == 0 {
		var objects int
		if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&objects); err != nil {
			return fmt.Errorf("cannot read the schema: %w", err)
		}
		if objects > 0 || appID != 0 {
			return fmt.Errorf("a SQLite database but not a rolter store (%d schema objects, application_id %#x); refusing to touch it", objects, appID)
		}
	} else if appID != applicationID {
		return fmt.Errorf("a SQLite database but not a rolter store (application_id %#x, want %#x); refusing to touch it", appID, applicationID)
	}
	var fk int
	if err := conn.QueryRowContext(ctx, "PRAGMA foreign_keys").Scan(&fk); err != nil || fk != 1 {
		return fmt.Errorf("BUG: foreign keys are not enforced (foreign_keys=%d, %v)", fk, err)
	}
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode = WAL").Scan(&mode); err != nil {
		return fmt.Errorf("cannot set the WAL journal mode: %w", err)
	}
	if mode != "wal" {
		return fmt.Errorf("cannot set the WAL journal mode: the journal mode stays %q", mode)
	}
	if err := migrate(ctx, conn, ms); err != nil {
		return err
	}
	return s.initMeta(ctx, conn)
}

// quickCheck runs PRAGMA quick_check: the structure of every b-tree page, without comparing indexes to
// their tables (https://www.sqlite.org/pragma.html#pragma_quick_check).
func quickCheck(ctx context.Context, conn *sql.Conn) error {
	rows, err := conn.QueryContext(ctx, "PRAGMA quick_check(8)")
	if err != nil {
		return fmt.Errorf("the integrity check failed: %w"+corruptHint, err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return fmt.Errorf("the integrity check failed: %w"+corruptHint, err)
		}
		problems = append(problems, p)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("the integrity check failed: %w"+corruptHint, err)
	}
	if len(problems) != 1 || problems[0] != "ok" {
		return fmt.Errorf("the integrity check failed: %q"+corruptHint, problems)
	}
	return nil
}
