// Package control is the control plane of Rolter: orgs, their providers, routes, data-plane keys and admin
// tokens, kept in a store (store.go: a SQLite file, or a PostgreSQL database shared by many gateways,
// postgres.go) and served under /api/v1.
package control

import (
	"bytes"
	"context"
	"crypto/cipher"
	"crypto/rand"
	"database/sql"
	"embed"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite" // registers the "sqlite" driver: pure Go, so CGO_ENABLED=0 builds keep the store
)

// Errors callers tell apart with errors.Is. Every error the store returns for a refused write wraps one of
// them; a *VersionConflictError wraps ErrConflict.
var (
	// ErrNotFound: the org, provider, route, key or token named does not exist (in that org).
	ErrNotFound = errors.New("not found")
	// ErrConflict: a name, model or hash is taken, a key or token is already revoked, or a conditional
	// write expected another version (then the error is a *VersionConflictError).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: an argument the store cannot keep (an empty or over-long name, a config that is not JSON).
	ErrInvalid = errors.New("invalid")
	// ErrUnavailable: the store's database cannot be reached (PostgreSQL down, restarting or cut off). Nothing
	// was read; a write may or may not have committed only when the connection broke during its commit.
	ErrUnavailable = errors.New("the store is unreachable")
)

// VersionConflictError is the conflict of a conditional write: the caller expected version Expected and
// the stored object is at Current (0 when it does not exist). errors.Is(err, ErrConflict) holds.
type VersionConflictError struct {
	Expected int64
	Current  int64
}

func (e *VersionConflictError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("conflict: expected version %d, but it does not exist", e.Expected)
	}
	return fmt.Sprintf("conflict: expected version %d, the stored version is %d", e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrConflict) hold for a version conflict.
func (e *VersionConflictError) Is(target error) bool { return target == ErrConflict }

// Org is a tenant: providers, routes, keys and tokens belong to one.
type Org struct {
	ID      string // "org_" and 12 base32 characters, chosen by the store
	Name    string // unique across orgs
	Created time.Time
}

// Provider is an org's upstream definition. Config is opaque JSON to the store.
type Provider struct {
	OrgID   string
	Name    string // unique within the org
	Config  json.RawMessage
	Version int64 // 1 when created, +1 on each replace
	Created time.Time
	Updated time.Time
}

// Route maps a public model name to an org's providers. Config is opaque JSON to the store.
type Route struct {
	OrgID   string
	Model   string // unique across all orgs: the public model names are one namespace
	Config  json.RawMessage
	Version int64 // 1 when created, +1 on each replace
	Created time.Time
	Updated time.Time
}

// Credential is a data-plane key or an org admin token as listed: never the secret, nor its hash.
type Credential struct {
	ID      string // "key_..." or "tok_...", chosen by the store
	OrgID   string
	Name    string
	Prefix  string // the first characters of the secret, for display
	Created time.Time
	Revoked time.Time // zero while the credential is valid
}

// KeyHash is a valid data-plane key as the gateway needs it: the hash of its secret and its org.
type KeyHash struct {
	Hash  [32]byte
	ID    string
	OrgID string
}

// AuditEntry is one write of the store.
type AuditEntry struct {
	ID         int64 // increasing
	At         time.Time
	Generation int64  // the generation the write produced
	Actor      string // "superadmin" or a token id
	OrgID      string // the org written to
	Action     string // "create", "replace", "delete" or "revoke"
	Object     string // "org", "provider", "route", "key", "token" or "secret"
	Name       string // the object's name: org name, provider name, model, key or token id
	Detail     string // e.g. "version 3"
}

// State is everything the gateway needs, read in one transaction: a consistent snapshot at Generation.
// Orgs are sorted by name, providers by org and name, routes by model, keys by org and id.
type State struct {
	Generation int64
	Pepper     [32]byte
	Orgs       []Org
	Providers  []Provider
	Routes     []Route
	Keys       []KeyHash // the non-revoked ones
	// Secrets are the orgs' secrets, decrypted, sorted by org and name: only Compose reads them.
	Secrets []SecretValue
}

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

	// pinned: writes commit only onto generation atGeneration (at).
	pinned       bool
	atGeneration int64
}

// applicationID marks a rolter store in the SQLite header ("rolt"); set by 0001_init.sql.
const applicationID = 0x726f6c74

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

// sqliteMagic starts every SQLite 3 database file (https://www.sqlite.org/fileformat2.html, 1.3).
const sqliteMagic = "SQLite format 3\x00"

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

// newerSchemaError refuses a store migrated by a newer rolter: its schema may mean what this binary cannot
// know, and migrations only go up.
type newerSchemaError struct {
	path           string
	version, known int
}

func (e *newerSchemaError) Error() string {
	return fmt.Sprintf("store %s has schema version %d; this rolter knows up to %d: upgrade rolter, never downgrade a store", e.path, e.version, e.known)
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

// audit is the audit row of a write, without its time, actor and generation.
type audit struct {
	orgID, action, object, name, detail string
}

// write runs fn in one write transaction that also bumps the generation and appends the audit row fn
// returns, and commits it. Nothing of a write whose fn fails is kept.
//
// The generation is bumped first: that takes the write lock of every store sharing the database (SQLite
// holds it from BEGIN IMMEDIATE already; in PostgreSQL it is the meta row's lock), so writes are serialised
// across gateways and fn reads what the write before it committed. On PostgreSQL the commit also notifies
// every gateway listening (replica.go).
func (s *Store) write(ctx context.Context, actor string, fn func(tx dbtx, now int64) (audit, error)) error {
	if err := checkName("actor", actor, 128); err != nil {
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
		return fmt.Errorf("%w: the store moved from generation %d to %d", errStale, s.atGeneration, gen-1)
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

// errStale refuses a write of a store view made by at whose generation moved: the caller validated the
// change against a state another gateway has since changed, and validates it again.
var errStale = errors.New("the store changed meanwhile")

// at returns a view of s whose writes commit only onto generation gen, else fail with errStale: a change
// checked against the state at gen is never written onto another gateway's newer change unchecked.
func (s *Store) at(gen int64) *Store {
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

// querier is what a transaction, a connection and the pool share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ querier = (*sql.DB)(nil)
	_ querier = (*sql.Tx)(nil)
	_ querier = (*sql.Conn)(nil)
)

// dbtx runs the store's queries, written with SQLite's placeholders (? and ?NNN), on q: for PostgreSQL
// they are rewritten to $N.
type dbtx struct {
	q  querier
	pg bool
}

func (t dbtx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return t.q.ExecContext(ctx, t.rebind(query), args...)
}

func (t dbtx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return t.q.QueryContext(ctx, t.rebind(query), args...)
}

func (t dbtx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return t.q.QueryRowContext(ctx, t.rebind(query), args...)
}

// rebind rewrites the placeholders of query for PostgreSQL: ?NNN to $NNN, and the n-th bare ? to $n. The
// store's queries have no ? inside string literals.
func (t dbtx) rebind(query string) string {
	if !t.pg || !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c != '?' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('$')
		if i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9' {
			continue // ?NNN: the digits follow
		}
		n++
		b.WriteString(strconv.Itoa(n))
	}
	return b.String()
}

// pool returns the store's queries on its connection pool, outside any transaction.
func (s *Store) pool() dbtx { return dbtx{s.db, s.pg != nil} }

// Limits of what the store keeps; over them a write fails with ErrInvalid.
const (
	maxNameLen   = 256
	maxPrefixLen = 32
	maxConfigLen = 1 << 20
)

// checkName refuses an empty or over-long name, one that is not UTF-8, and one with control characters.
func checkName(what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: the %s is empty", ErrInvalid, what)
	case len(s) > max:
		return fmt.Errorf("%w: the %s has %d bytes, more than %d", ErrInvalid, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: the %s %q is not UTF-8", ErrInvalid, what, s)
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: the %s %q has control characters", ErrInvalid, what, s)
	}
	return nil
}

func checkConfig(config []byte) error {
	switch {
	case len(config) > maxConfigLen:
		return fmt.Errorf("%w: the config has %d bytes, more than %d", ErrInvalid, len(config), maxConfigLen)
	case !json.Valid(config):
		return fmt.Errorf("%w: the config is not JSON", ErrInvalid)
	}
	return nil
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix and 12 random base32 characters (60 bits).
func newID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error()) // rand.Read never fails since Go 1.24
	}
	return prefix + idEncoding.EncodeToString(b[:])[:12]
}

func millis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// orgExists fails with ErrNotFound when orgID is not an org.
func orgExists(ctx context.Context, tx dbtx, orgID string) error {
	var one int
	err := tx.QueryRowContext(ctx, "SELECT 1 FROM orgs WHERE id = ?", orgID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: no org %q", ErrNotFound, orgID)
	}
	return err
}

// CreateOrg creates an org named name. A name already taken fails with ErrConflict.
func (s *Store) CreateOrg(ctx context.Context, actor, name string) (Org, error) {
	o := Org{ID: newID("org_"), Name: name}
	if err := checkName("org name", name, maxNameLen); err != nil {
		return Org{}, fmt.Errorf("cannot create org %q: %w", name, err)
	}
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var id string
		err := tx.QueryRowContext(ctx, "SELECT id FROM orgs WHERE name = ?", name).Scan(&id)
		if err == nil {
			return audit{}, fmt.Errorf("%w: the name is taken by org %q", ErrConflict, id)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return audit{}, err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO orgs (id, name, created) VALUES (?, ?, ?)", o.ID, name, now); err != nil {
			return audit{}, err
		}
		o.Created = millis(now)
		return audit{orgID: o.ID, action: "create", object: "org", name: name, detail: o.ID}, nil
	})
	if err != nil {
		return Org{}, fmt.Errorf("cannot create org %q: %w", name, err)
	}
	return o, nil
}

// GetOrg returns the org orgID, or ErrNotFound.
func (s *Store) GetOrg(ctx context.Context, orgID string) (Org, error) {
	var o Org
	var created int64
	err := s.pool().QueryRowContext(ctx, "SELECT id, name, created FROM orgs WHERE id = ?", orgID).Scan(&o.ID, &o.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		err = ErrNotFound
	}
	err = s.reach(err)
	if err != nil {
		return Org{}, fmt.Errorf("cannot get org %q: %w", orgID, err)
	}
	o.Created = millis(created)
	return o, nil
}

// ListOrgs returns every org, sorted by name.
func (s *Store) ListOrgs(ctx context.Context) ([]Org, error) {
	var orgs []Org
	err := s.read(ctx, func(tx dbtx) error {
		var err error
		orgs, err = listOrgs(ctx, tx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list orgs: %w", err)
	}
	return orgs, nil
}

func listOrgs(ctx context.Context, tx dbtx) ([]Org, error) {
	rows, err := tx.QueryContext(ctx, "SELECT id, name, created FROM orgs ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var orgs []Org
	for rows.Next() {
		var o Org
		var created int64
		if err := rows.Scan(&o.ID, &o.Name, &created); err != nil {
			return nil, err
		}
		o.Created = millis(created)
		orgs = append(orgs, o)
	}
	return orgs, rows.Err()
}

// DeleteOrg deletes the org orgID with its providers, routes, keys and tokens. Its audit rows stay.
func (s *Store) DeleteOrg(ctx context.Context, actor, orgID string) error {
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var name string
		var providers, routes, keys, tokens int
		err := tx.QueryRowContext(ctx, `SELECT name,
			(SELECT count(*) FROM providers WHERE org_id = orgs.id),
			(SELECT count(*) FROM routes WHERE org_id = orgs.id),
			(SELECT count(*) FROM keys WHERE org_id = orgs.id),
			(SELECT count(*) FROM tokens WHERE org_id = orgs.id)
			FROM orgs WHERE id = ?`, orgID).Scan(&name, &providers, &routes, &keys, &tokens)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, ErrNotFound
		}
		if err != nil {
			return audit{}, err
		}
		// The foreign keys' ON DELETE CASCADE deletes the rest.
		if _, err := tx.ExecContext(ctx, "DELETE FROM orgs WHERE id = ?", orgID); err != nil {
			return audit{}, err
		}
		detail := fmt.Sprintf("%s with providers %d, routes %d, keys %d, tokens %d", orgID, providers, routes, keys, tokens)
		return audit{orgID: orgID, action: "delete", object: "org", name: name, detail: detail}, nil
	})
	if err != nil {
		return fmt.Errorf("cannot delete org %q: %w", orgID, err)
	}
	return nil
}

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

// createOnly is the expected version of CreateProvider and CreateRoute: fail if the object exists.
const createOnly = -1

// put creates or replaces (orgID, name): only creates with expect createOnly, creates or replaces with 0,
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
	case expect == createOnly && current != 0:
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

func (r row) provider() Provider {
	return Provider{OrgID: r.orgID, Name: r.name, Config: r.config, Version: r.version, Created: millis(r.created), Updated: millis(r.updated)}
}

func (r row) route() Route {
	return Route{OrgID: r.orgID, Model: r.name, Config: r.config, Version: r.version, Created: millis(r.created), Updated: millis(r.updated)}
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
	if _, err := s.putVersioned(ctx, providerTable, actor, orgID, name, config, createOnly); err != nil {
		return fmt.Errorf("cannot create provider %q of org %q: %w", name, orgID, err)
	}
	return nil
}

// putVersioned writes v's (orgID, name) as put does and returns the row as written; its config is config.
func (s *Store) putVersioned(ctx context.Context, v versioned, actor, orgID, name string, config []byte, expect int64) (row, error) {
	if err := checkName(v.object+" "+v.key, name, maxNameLen); err != nil {
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

// putObject is PutProvider, CreateProvider with expect createOnly, or the same for routes (v), returning
// the object as written: what the API answers, even when another gateway replaces it right after.
func (s *Store) putObject(ctx context.Context, v versioned, actor, orgID, name string, config []byte, expect int64) (storedObject, error) {
	r, err := s.putVersioned(ctx, v, actor, orgID, name, config, expect)
	if err != nil {
		return storedObject{}, fmt.Errorf("cannot put %s %q of org %q: %w", v.object, name, orgID, err)
	}
	return storedObject{r.name, r.config, r.version, millis(r.created), millis(r.updated)}, nil
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

func (s *Store) deleteVersioned(ctx context.Context, v versioned, actor, orgID, name string, expect int64) error {
	if expect < 0 {
		return fmt.Errorf("%w: expected version %d", ErrInvalid, expect)
	}
	return s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		return v.delete(ctx, tx, orgID, name, expect)
	})
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
	if _, err := s.putVersioned(ctx, routeTable, actor, orgID, model, config, createOnly); err != nil {
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

// credentials is what keys and tokens share.
type credentials struct {
	object   string // "key" or "token"
	table    string
	idPrefix string
}

var (
	keyTable   = credentials{object: "key", table: "keys", idPrefix: "key_"}
	tokenTable = credentials{object: "token", table: "tokens", idPrefix: "tok_"}
)

func (c credentials) create(ctx context.Context, s *Store, actor, orgID, name string, hash [32]byte, prefix string) (Credential, error) {
	if err := checkName(c.object+" name", name, maxNameLen); err != nil {
		return Credential{}, err
	}
	if err := checkName(c.object+" prefix", prefix, maxPrefixLen); err != nil {
		return Credential{}, err
	}
	cr := Credential{ID: newID(c.idPrefix), OrgID: orgID, Name: name, Prefix: prefix}
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return audit{}, err
		}
		// A secret is a key or a token, never both: the hash is unique across the two tables.
		var taken int
		if err := tx.QueryRowContext(ctx, "SELECT (SELECT count(*) FROM keys WHERE hash = ?1) + (SELECT count(*) FROM tokens WHERE hash = ?1)", hash[:]).Scan(&taken); err != nil {
			return audit{}, err
		}
		if taken > 0 {
			return audit{}, fmt.Errorf("%w: the hash is taken", ErrConflict)
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO "+c.table+" (id, org_id, name, hash, prefix, created) VALUES (?, ?, ?, ?, ?, ?)",
			cr.ID, orgID, name, hash[:], prefix, now); err != nil {
			return audit{}, err
		}
		cr.Created = millis(now)
		return audit{orgID: orgID, action: "create", object: c.object, name: cr.ID, detail: fmt.Sprintf("name %q prefix %q", name, prefix)}, nil
	})
	return cr, err
}

func (c credentials) list(ctx context.Context, s *Store, orgID string) ([]Credential, error) {
	var out []Credential
	err := s.read(ctx, func(tx dbtx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT id, org_id, name, prefix, created, revoked FROM "+c.table+" WHERE org_id = ? ORDER BY created, id", orgID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var cr Credential
			var created int64
			var revoked sql.NullInt64
			if err := rows.Scan(&cr.ID, &cr.OrgID, &cr.Name, &cr.Prefix, &created, &revoked); err != nil {
				return err
			}
			cr.Created = millis(created)
			if revoked.Valid {
				cr.Revoked = millis(revoked.Int64)
			}
			out = append(out, cr)
		}
		return rows.Err()
	})
	return out, err
}

func (c credentials) revoke(ctx context.Context, s *Store, actor, orgID, id string) error {
	return s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		var revoked sql.NullInt64
		var name string
		err := tx.QueryRowContext(ctx, "SELECT name, revoked FROM "+c.table+" WHERE id = ? AND org_id = ?", id, orgID).Scan(&name, &revoked)
		if errors.Is(err, sql.ErrNoRows) {
			return audit{}, ErrNotFound
		}
		if err != nil {
			return audit{}, err
		}
		if revoked.Valid {
			return audit{}, fmt.Errorf("%w: revoked already, at %s", ErrConflict, millis(revoked.Int64).Format(time.RFC3339))
		}
		if _, err := tx.ExecContext(ctx, "UPDATE "+c.table+" SET revoked = ? WHERE id = ?", now, id); err != nil {
			return audit{}, err
		}
		return audit{orgID: orgID, action: "revoke", object: c.object, name: id, detail: fmt.Sprintf("name %q", name)}, nil
	})
}

// CreateKey records a data-plane key of org orgID: hash is SHA-256(Pepper() || secret), prefix the
// secret's first characters for display. The store never sees the secret. A hash already used by a key or
// a token is ErrConflict; a missing org is ErrNotFound.
func (s *Store) CreateKey(ctx context.Context, actor, orgID, name string, hash [32]byte, prefix string) (Credential, error) {
	k, err := keyTable.create(ctx, s, actor, orgID, name, hash, prefix)
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

// CreateToken records an admin token of org orgID, as CreateKey does keys.
func (s *Store) CreateToken(ctx context.Context, actor, orgID, name string, hash [32]byte, prefix string) (Credential, error) {
	t, err := tokenTable.create(ctx, s, actor, orgID, name, hash, prefix)
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

// Audit returns at most limit (> 0) audit entries, newest first: those of org orgID, or all with orgID "".
func (s *Store) Audit(ctx context.Context, orgID string, limit int) ([]AuditEntry, error) {
	if limit <= 0 {
		return nil, fmt.Errorf("cannot read the audit log: %w: limit %d", ErrInvalid, limit)
	}
	q := "SELECT id, at, generation, actor, org_id, action, object, name, detail FROM audit"
	args := []any{}
	if orgID != "" {
		q += " WHERE org_id = ?"
		args = append(args, orgID)
	}
	q += " ORDER BY id DESC LIMIT ?"
	args = append(args, limit)
	rows, err := s.pool().QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
	}
	defer rows.Close()
	var out []AuditEntry
	for rows.Next() {
		var e AuditEntry
		var at int64
		var org sql.NullString
		if err := rows.Scan(&e.ID, &at, &e.Generation, &e.Actor, &org, &e.Action, &e.Object, &e.Name, &e.Detail); err != nil {
			return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
		}
		e.At, e.OrgID = millis(at), org.String
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read the audit log: %w", s.reach(err))
	}
	return out, nil
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
		rows, err := tx.QueryContext(ctx, "SELECT hash, id, org_id FROM keys WHERE revoked IS NULL ORDER BY org_id, id")
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k KeyHash
			var hash []byte
			if err := rows.Scan(&hash, &k.ID, &k.OrgID); err != nil {
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

// Replica is one gateway running on the store, as it last reported itself (replica.go).
type Replica struct {
	ID         string // host name and process id
	Address    string // where its control plane listens
	Version    string // its rolter version
	Generation int64  // the store generation its config serves
	Error      string // why it does not serve a newer generation ("" when none)
	Seen       time.Time
}

// replicaForget is how long a replica that stopped reporting stays listed.
const replicaForget = time.Hour

// ReportReplica records r, seen now, and forgets the replicas not seen for replicaForget. It is not a
// change of the store: the generation stays, and no audit row is written.
func (s *Store) ReportReplica(ctx context.Context, r Replica) error {
	if err := checkName("replica id", r.ID, maxNameLen); err != nil {
		return fmt.Errorf("cannot report replica %q: %w", r.ID, err)
	}
	now := s.now()
	q := s.pool()
	_, err := q.ExecContext(ctx, `INSERT INTO replicas (id, address, version, generation, error, seen) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET address = excluded.address, version = excluded.version,
		generation = excluded.generation, error = excluded.error, seen = excluded.seen`,
		r.ID, r.Address, r.Version, r.Generation, r.Error, now.UnixMilli())
	if err == nil {
		_, err = q.ExecContext(ctx, "DELETE FROM replicas WHERE seen < ?", now.Add(-replicaForget).UnixMilli())
	}
	if err != nil {
		return fmt.Errorf("cannot report replica %q: %w", r.ID, s.reach(err))
	}
	return nil
}

// Replicas returns the replicas that reported within replicaForget, sorted by id.
func (s *Store) Replicas(ctx context.Context) ([]Replica, error) {
	var out []Replica
	err := s.read(ctx, func(tx dbtx) error {
		rows, err := tx.QueryContext(ctx, "SELECT id, address, version, generation, error, seen FROM replicas WHERE seen >= ? ORDER BY id",
			s.now().Add(-replicaForget).UnixMilli())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r Replica
			var seen int64
			if err := rows.Scan(&r.ID, &r.Address, &r.Version, &r.Generation, &r.Error, &seen); err != nil {
				return err
			}
			r.Seen = millis(seen)
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list replicas: %w", err)
	}
	return out, nil
}
