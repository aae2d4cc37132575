// Package natstest starts throwaway NATS servers for tests, from Debian's nats-server package: one process
// per Server on a free loopback port, its log in a temporary directory, which a test can kill and start
// again on the same port. Without the binary a test skips, unless ROLTER_REQUIRE_NATS=1, when it fails.
package natstest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
)

// RequireEnv names the environment variable that turns a skip for want of nats-server into a failure.
const RequireEnv = "ROLTER_REQUIRE_NATS"

// Server is one nats-server process. Safe for concurrent use.
type Server struct {
	bin  string
	dir  string
	port int
	conf string // the server's config file, "" for none

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil when stopped
	exited chan struct{} // closed when cmd's Wait returned
}

var errNoBinary = errors.New("no nats-server binary (install Debian's nats-server package)")

// binary finds nats-server on PATH or where Debian puts it.
func binary() string {
	if p, err := exec.LookPath("nats-server"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/sbin/nats-server", "/usr/bin/nats-server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// New starts a server of the test's own on a free loopback port; it is stopped at cleanup.
func New(t testing.TB) *Server {
	t.Helper()
	return NewWithConfig(t, "")
}

// NewWithConfig starts a server like New with conf as its config file (nats-server's format: an
// authorization or tls block, say); the listen address and port stay New's.
func NewWithConfig(t testing.TB, conf string) *Server {
	t.Helper()
	bin := binary()
	if bin == "" {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s=1 but %v", RequireEnv, errNoBinary)
		}
		t.Skip(errNoBinary)
	}
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), port: port}
	if conf != "" {
		s.conf = filepath.Join(s.dir, "nats-server.conf")
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return s
}

// URL is the server's nats:// URL.
func (s *Server) URL() string { return "nats://127.0.0.1:" + strconv.Itoa(s.port) }

// Port is the server's port.
func (s *Server) Port() int { return s.port }

// Start starts the stopped server on its port and waits until it greets a client.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("BUG: nats-server is running already")
	}
	logPath := filepath.Join(s.dir, "nats-server.log")
	args := []string{"-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-l", logPath, "-P", filepath.Join(s.dir, "nats-server.pid")}
	if s.conf != "" {
		args = append(args, "-c", s.conf)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	// The server dies with the test binary, whatever way that ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start nats-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if greets(s.port) {
			s.cmd, s.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("nats-server exited at start: %s", strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("nats-server does not answer on port %d after 20s (log: %s)", s.port, logPath)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// greets reports whether a NATS server on port sends its INFO line.
func greets(port int) bool {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && strings.HasPrefix(line, "INFO ")
}

// Kill ends the server at once (SIGKILL: no lame-duck mode, clients see their connections drop) and waits
// for it to exit. A stopped server is left alone.
func (s *Server) Kill() { s.stop(syscall.SIGKILL) }

// Stop shuts the server down cleanly (SIGTERM) and waits for it to exit.
func (s *Server) Stop() { s.stop(syscall.SIGTERM) }

func (s *Server) stop(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.cmd, s.exited = nil, nil
}
