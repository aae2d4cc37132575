package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// The PostgreSQL store: `[control] store = "postgres://..."`. Every gateway of a fleet opens the
// same database; the schema and the Store methods are SQLite's. What differs is here: the connection, the
// migrations' bookkeeping (rolter_schema stands for SQLite's user_version), telling a database that cannot
// be reached from one that refused a query (ErrUnavailable), and LISTEN, by which a gateway hears of every
// write another gateway commits (Listen).

// notifyChannel is the channel every write notifies at commit, with its generation as the payload.
const notifyChannel = "rolter_generation"

// migrateLock is the advisory lock that lets one gateway at a time migrate a database ("rolter" in ASCII).
const migrateLock = 0x726f6c746572

// Settings of each connection that the URL does not set itself. The lock and idle timeouts bound how long
// a write can wait for the meta row's lock held by a gateway that hangs mid-transaction.
var pgSessionDefaults = map[string]string{
	"application_name":                    "rolter",
	"lock_timeout":                        "10s",
	"idle_in_transaction_session_timeout": "60s",
}

// pgConnectTimeout bounds a connection attempt when the URL sets no connect_timeout: a database behind a
// cut network must not hang an API request or the replica's reconnects.
const pgConnectTimeout = 5 * time.Second

// isPostgres reports whether a [control] store value names a PostgreSQL database rather than a file.
func isPostgres(path string) bool {
	return strings.HasPrefix(path, "postgres://") || strings.HasPrefix(path, "postgresql://")
}

// redactURL returns a PostgreSQL URL without its password, for logs and errors.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "postgres://(unparsable URL)"
	}
	return u.Redacted()
}

// openPostgres opens the PostgreSQL database of the URL dsn (libpq's URL form; PGPASSWORD and the other PG*
// environment variables fill in what it leaves out) and migrates its schema to SchemaVersion(). Gateways
// opening one database at once migrate it one at a time.
func openPostgres(ctx context.Context, dsn string, ms []migration) (*Store, error) {
	display := redactURL(dsn)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("cannot open store %s: %w", display, err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = pgConnectTimeout
	}
	for k, v := range pgSessionDefaults {
		if _, ok := cfg.RuntimeParams[k]; !ok {
			cfg.RuntimeParams[k] = v
		}
	}
	db := stdlib.OpenDB(*cfg)
	// The control plane is not hot: a few connections serve the API, Load and the replica's reports.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{path: display, db: db, pg: cfg, now: time.Now}
	if err := s.initPostgres(ctx, ms); err != nil {
		db.Close()
		var newer *newerSchemaError
		if errors.As(err, &newer) {
			return nil, err
		}
		return nil, fmt.Errorf("cannot open store %s: %w", display, err)
	}
	return s, nil
}

// initPostgres migrates the database and reads (or creates) the pepper, under the migration lock.
func (s *Store) initPostgres(ctx context.Context, ms []migration) error {
	conn, err := s.db.Conn(ctx) // one session: the advisory lock is the session's
	if err != nil {
		return s.reach(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLock)); err != nil {
		return s.reach(err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", int64(migrateLock))
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS rolter_schema (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL)"); err != nil {
		return fmt.Errorf("cannot create the schema version table: %w", s.reach(err))
	}
	var version int
	err = conn.QueryRowContext(ctx, "SELECT version FROM rolter_schema WHERE id = 1").Scan(&version)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("cannot read the schema version: %w", s.reach(err))
	}
	if version > len(ms) {
		return &newerSchemaError{path: s.path, version: version, known: len(ms)}
	}
	for _, m := range ms[version:] {
		if err := s.migratePostgres(ctx, conn, m); err != nil {
			return fmt.Errorf("cannot apply migration %q: %w", "postgres/"+m.name, s.reach(err))
		}
	}
	return s.initMeta(ctx, conn)
}

// migratePostgres applies m and records its version in one transaction (PostgreSQL's DDL is
// transactional): a database is always at exactly one version.
func (s *Store) migratePostgres(ctx context.Context, conn *sql.Conn, m migration) error {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, m.sql); err != nil { // no arguments: the simple protocol, many statements
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO rolter_schema (id, version) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET version = excluded.version", m.version); err != nil {
		return err
	}
	return tx.Commit()
}

// reach wraps err in ErrUnavailable when it says the database cannot be reached rather than that it
// refused a query; for SQLite, and for nil, it returns err as it is.
func (s *Store) reach(err error) error {
	if err == nil || s.pg == nil || errors.Is(err, ErrUnavailable) || !unreachable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// unreachable reports whether err of the PostgreSQL driver means the database cannot be reached now: no
// connection, a connection that broke, a timeout, or the server's own "shutting down", "starting up", "too
// many connections" and "lock timeout" (SQLSTATE classes 08, 57, 53 and code 55P03, PostgreSQL's Appendix
// A).
func unreachable(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		if pe.Code == "55P03" {
			return true
		}
		switch pe.Code[:min(2, len(pe.Code))] {
		case "08", "53", "57":
			return true
		}
		return false
	}
	var ne net.Error
	var ce *pgconn.ConnectError
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		strings.Contains(err.Error(), "conn closed")
}

// Listener hears every write committed to a PostgreSQL store: a connection of its own that LISTENs on
// notifyChannel. Not safe for concurrent use: one goroutine (the follower's) owns it.
type Listener struct {
	conn  *pgx.Conn
	store *Store // whose reach tells Wait's errors of an unreachable database
}

// Postgres reports whether the store is a PostgreSQL database, whose writes a Listener hears.
func (s *Store) Postgres() bool { return s.pg != nil }

// Listen opens a Listener; nil for a SQLite store, which has no one to hear from.
func (s *Store) Listen(ctx context.Context) (*Listener, error) {
	if s.pg == nil {
		return nil, nil
	}
	conn, err := pgx.ConnectConfig(ctx, s.pg.Copy())
	if err != nil {
		return nil, fmt.Errorf("cannot listen for changes: %w", s.reach(err))
	}
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("cannot listen for changes: %w", s.reach(err))
	}
	return &Listener{conn: conn, store: s}, nil
}

// Wait returns true when a write was committed since the last Wait, false when d passed without one. After
// a quiet d it pings the server, since a cut network closes nothing. An error means the connection is gone
// (ErrUnavailable when the database cannot be reached): Close it and Listen again.
func (l *Listener) Wait(ctx context.Context, d time.Duration) (bool, error) {
	ok, err := l.wait(ctx, d)
	return ok, l.store.reach(err)
}

func (l *Listener) wait(ctx context.Context, d time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, d)
	_, err := l.conn.WaitForNotification(wctx)
	quiet := err != nil && wctx.Err() != nil && ctx.Err() == nil
	cancel()
	switch {
	case err == nil:
		return true, nil
	case !quiet || l.conn.IsClosed():
		return false, err
	}
	pctx, cancel := context.WithTimeout(ctx, pgConnectTimeout)
	defer cancel()
	if err := l.conn.Ping(pctx); err != nil {
		return false, fmt.Errorf("the listening connection is gone: %w", err)
	}
	return false, nil
}

// Close closes the listening connection.
func (l *Listener) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
}
