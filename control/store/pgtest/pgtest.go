// Package pgtest starts throwaway PostgreSQL servers for tests, from Debian's postgresql package: initdb in
// a temporary directory, then postgres on a free loopback port, as an unprivileged user when the tests run
// as root (PostgreSQL refuses root). Without the binaries a test skips, unless ROLTER_REQUIRE_POSTGRES=1
// (make test sets it, and make deps installs the package), when it fails.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rolter-ai/rolter/internal/freeport"
)

// RequireEnv names the environment variable that turns a skip for want of PostgreSQL into a failure.
const RequireEnv = "ROLTER_REQUIRE_POSTGRES"

// Server is one PostgreSQL server. Its user "rolter" is a superuser, trusted without a password.
//
// Server is safe for concurrent use.
type Server struct {
	bin  string // the directory of initdb and postgres
	dir  string // owned by the server's user: data/ and the log
	port int
	cred *syscall.Credential // nil when the tests do not run as root

	mu  sync.Mutex
	cmd *exec.Cmd
	n   atomic.Int64 // databases made
}

// binDir finds the directory of PostgreSQL's server binaries: the newest /usr/lib/postgresql/*/bin, or
// initdb on PATH.
func binDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) > pgMajor(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Dir(p)
		}
	}
	return ""
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// New initialises and starts a new server of its own (for a test that stops it); it is stopped and removed
// at cleanup.
func New(t testing.TB) *Server {
	t.Helper()
	p, err := start()
	if errors.Is(err, errNoBinaries) {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s=1 but %v", RequireEnv, err)
		}
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.remove)
	return p
}

var errNoBinaries = errors.New("no PostgreSQL server binaries (install Debian's postgresql package: make deps)")

func start() (*Server, error) {
	bin := binDir()
	if bin == "" {
		return nil, errNoBinaries
	}
	p := &Server{bin: bin}
	dir, err := os.MkdirTemp("", "rolter-pg-")
	if err != nil {
		return nil, err
	}
	p.dir = dir
	if os.Geteuid() == 0 {
		// PostgreSQL refuses to run as root: its own user if the package made one, else nobody.
		var u *user.User
		for _, name := range []string{"postgres", "nobody"} {
			if u, err = user.Lookup(name); err == nil {
				break
			}
		}
		if u == nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("cannot find a user to run PostgreSQL as: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	out, err := p.command(filepath.Join(bin, "initdb"), "-D", filepath.Join(dir, "data"), "-U", "rolter",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("cannot initdb: %v\n%s", err, out)
	}
	if p.port, err = freeport.Loopback(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := p.Start(); err != nil {
		p.remove()
		return nil, err
	}
	return p, nil
}

// command runs name as the server's user, which a root parent's death stops too.
func (p *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = p.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Pdeathsig: syscall.SIGQUIT}
	return cmd
}

// Start starts the stopped server again on its port and waits until it takes connections.
func (p *Server) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("BUG: PostgreSQL is running already")
	}
	logf, err := os.OpenFile(filepath.Join(os.TempDir(), filepath.Base(p.dir)+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	// fsync off: the tests kill gateways, never this server's machine.
	cmd := p.command(filepath.Join(p.bin, "postgres"), "-D", filepath.Join(p.dir, "data"), "-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off",
		"-c", "full_page_writes=off", "-c", "max_connections=200", "-c", "shared_buffers=32MB")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start postgres: %w", err)
	}
	p.cmd = cmd
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, p.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres does not take connections after 30s: %w (log: %s)", err, logf.Name())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down (fast shutdown: it ends every session, as a restart does) and waits for it.
func (p *Server) Stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.cmd = nil
}

func (p *Server) remove() {
	p.Stop()
	os.RemoveAll(p.dir)
	os.Remove(filepath.Join(os.TempDir(), filepath.Base(p.dir)+".log"))
}

// URL is the URL of database db.
func (p *Server) URL(db string) string {
	return fmt.Sprintf("postgres://rolter@127.0.0.1:%d/%s?sslmode=disable", p.port, db)
}

// NewDatabase creates an empty database and returns its URL.
func (p *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d", p.n.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return p.URL(name)
}

// shared is one server for the tests that do not stop it, started on first use and stopped by StopShared.
var shared struct {
	once sync.Once
	p    *Server
	err  error
}

// Database returns the URL of a new database on a server shared by the package's tests.
func Database(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() { shared.p, shared.err = start() })
	if errors.Is(shared.err, errNoBinaries) {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s=1 but %v", RequireEnv, shared.err)
		}
		t.Skip(shared.err)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.p.NewDatabase(t)
}

// StopShared stops and removes the shared server, if one started: call it from TestMain after m.Run.
func StopShared() {
	if shared.p != nil {
		shared.p.remove()
	}
}

// Port returns the server's port.
func (p *Server) Port() int { return p.port }
