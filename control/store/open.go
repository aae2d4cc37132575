package store

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Store is the control plane's persistent state: one SQLite file, or one PostgreSQL database that every
// gateway of a fleet shares (postgres.go), with the same schema, migrations and methods. Every write is one
// transaction that bumps the generation and appends one audit row, and is durable when it returns.
//
// Store is safe for concurrent use. Writes are serialised, across processes too; reads see only committed
// writes.
type Store struct {
	path   string // the file's absolute path, or the PostgreSQL URL without its password
	db     *sql.DB
	pg     *pgx.ConnConfig // nil for SQLite
	pepper [32]byte
	now    func() time.Time // time.Now but in tests
	// secrets seals the values of org secrets (secrets.go); nil without a secrets key.
	secrets cipher.AEAD

	// pinned: writes commit only onto generation atGeneration (At).
	pinned       bool
	atGeneration int64
}

// Open opens the store at path, creating it (mode 0600) when the file does not exist, and migrates its
// schema to SchemaVersion(). A path that is a postgres:// or postgresql:// URL opens that PostgreSQL
// database instead (openPostgres).
//
// Open never resets or overwrites a file it cannot use: a file that is not a SQLite database, a SQLite
// database of another program, a store that fails PRAGMA quick_check, or one whose schema is newer than
// this binary knows is refused with an error and left as it was (SQLite may still recover a write-ahead
// log left by a crash, which is its normal recovery, not a change of content).
func Open(path string) (*Store, error) {
	if isPostgres(path) {
		return openPostgres(context.Background(), path, pgMigrations)
	}
	return open(context.Background(), path, migrations)
}

// initMeta reads the pepper, creating the meta row with a new random pepper at the first open.
func (s *Store) initMeta(ctx context.Context, conn *sql.Conn) error {
	q := dbtx{conn, s.pg != nil}
	var pepper []byte
	err := q.QueryRowContext(ctx, "SELECT pepper FROM meta WHERE id = 1").Scan(&pepper)
	if errors.Is(err, sql.ErrNoRows) {
		var p [32]byte
		if _, err := rand.Read(p[:]); err != nil {
			return fmt.Errorf("cannot create the pepper: %w", err)
		}
		// DO NOTHING: another process may have created it meanwhile; read whichever is stored.
		if _, err := q.ExecContext(ctx, "INSERT INTO meta (id, generation, pepper) VALUES (1, 0, ?) ON CONFLICT (id) DO NOTHING", p[:]); err != nil {
			return fmt.Errorf("cannot create the pepper: %w", s.reach(err))
		}
		err = q.QueryRowContext(ctx, "SELECT pepper FROM meta WHERE id = 1").Scan(&pepper)
	}
	if err != nil {
		return fmt.Errorf("cannot read the pepper: %w", s.reach(err))
	}
	if len(pepper) != len(s.pepper) {
		return fmt.Errorf("BUG: the stored pepper has %d bytes", len(pepper))
	}
	copy(s.pepper[:], pepper)
	return nil
}

// Close closes the store. Calls after Close fail.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("cannot close store %q: %w", s.path, err)
	}
	return nil
}

// Path returns the absolute path of the store file, or the PostgreSQL URL without its password.
func (s *Store) Path() string { return s.path }

// Pepper returns the store's random 32-byte pepper, created at its first open and never changed: the
// control plane hashes secrets as SHA-256(pepper || secret).
func (s *Store) Pepper() [32]byte { return s.pepper }

// Generation returns the number of writes the store has committed: it increases by one with each.
func (s *Store) Generation(ctx context.Context) (int64, error) {
	var g int64
	if err := s.pool().QueryRowContext(ctx, "SELECT generation FROM meta WHERE id = 1").Scan(&g); err != nil {
		return 0, fmt.Errorf("cannot read the generation: %w", s.reach(err))
	}
	return g, nil
}

// write runs fn in one write transaction that also bumps the generation and appends the audit row fn
// returns, and commits it. Nothing of a write whose fn fails is kept.
//
// The generation is bumped first: that takes the write lock of every store sharing the database (SQLite
// holds it from BEGIN IMMEDIATE already; in PostgreSQL it is the meta row's lock), so writes are serialised
// across gateways and fn reads what the write before it committed. On PostgreSQL the commit also notifies
// every gateway listening (Listen).
func (s *Store) write(ctx context.Context, actor string, fn func(tx dbtx, now int64) (audit, error)) error {
	if err := CheckName("actor", actor, 128); err != nil {
		return err
	}
	sqlTx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock) on SQLite, READ COMMITTED on PostgreSQL
	if err != nil {
		return s.reach(err)
	}
	defer sqlTx.Rollback() // after Commit, a no-op
	tx := dbtx{sqlTx, s.pg != nil}
	var gen int64
	if err := tx.QueryRowContext(ctx, "UPDATE meta SET generation = generation + 1 WHERE id = 1 RETURNING generation").Scan(&gen); err != nil {
		return s.reach(err)
	}
	if s.pinned && gen-1 != s.atGeneration {
		return fmt.Errorf("%w: the store moved from generation %d to %d", ErrStale, s.atGeneration, gen-1)
	}
	now := s.now().UnixMilli()
	a, err := fn(tx, now)
	if err != nil {
		return s.reach(err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO audit (at, generation, actor, org_id, action, object, name, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
		now, gen, actor, a.orgID, a.action, a.object, a.name, a.detail); err != nil {
		return s.reach(err)
	}
	if s.pg != nil {
		// Delivered at commit, to every session listening, in commit order (NOTIFY in the PostgreSQL docs).
		if _, err := tx.ExecContext(ctx, "SELECT pg_notify(?, ?)", notifyChannel, strconv.FormatInt(gen, 10)); err != nil {
			return s.reach(err)
		}
	}
	return s.reach(sqlTx.Commit())
}

// ErrStale refuses a write of a store view made by At whose generation moved: the caller validated the
// change against a state another gateway has since changed, and validates it again.
var ErrStale = errors.New("the store changed meanwhile")

// At returns a view of s whose writes commit only onto generation gen, else fail with ErrStale: a change
// checked against the state at gen is never written onto another gateway's newer change unchecked.
func (s *Store) At(gen int64) *Store {
	v := *s
	v.pinned, v.atGeneration = true, gen
	return &v
}

// read runs fn in one read transaction: every query of fn sees the same committed state (a snapshot:
// PostgreSQL reads at REPEATABLE READ, SQLite's read transaction is one already).
func (s *Store) read(ctx context.Context, fn func(tx dbtx) error) error {
	opts := &sql.TxOptions{ReadOnly: true} // a deferred BEGIN on SQLite: takes no write lock
	if s.pg != nil {
		opts.Isolation = sql.LevelRepeatableRead
	}
	sqlTx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return s.reach(err)
	}
	defer sqlTx.Rollback()
	if err := fn(dbtx{sqlTx, s.pg != nil}); err != nil {
		return s.reach(err)
	}
	return s.reach(sqlTx.Commit())
}
