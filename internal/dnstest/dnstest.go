// Package dnstest runs Debian's dnsmasq for tests: a real DNS server on a loopback port, answering only
// from the files a test gives it (A and AAAA records in a hosts file, read again on SIGHUP; SRV and other
// records in its conf file, read at start), with a TTL of one second.
package dnstest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
	"golang.org/x/net/dns/dnsmessage"
)

// RequireEnv turns a skip for want of dnsmasq into a failure (make test sets it).
const RequireEnv = "ROLTER_REQUIRE_DNSMASQ"

// dnsmasqBinary is where Debian's dnsmasq-base puts the server.
const dnsmasqBinary = "/usr/sbin/dnsmasq"

// Server is one dnsmasq process of a test, serving only what its files say, on a loopback port it keeps
// across restarts. Safe for concurrent use.
type Server struct {
	t     testing.TB
	dir   string
	port  int
	conf  string // the conf file: srv-host= lines and the like, read at start
	hosts string // an addn-hosts file, read again on SIGHUP

	mu     sync.Mutex
	cmd    *exec.Cmd     // nil when stopped
	exited chan struct{} // closed when cmd's Wait returned
}

// Start starts dnsmasq with conf (conf-file lines) and hosts (hosts-file lines); it is killed at
// cleanup. Without dnsmasq the test skips, or fails under ROLTER_REQUIRE_DNSMASQ=1.
func Start(t testing.TB, conf, hosts string) *Server {
	t.Helper()
	if _, err := os.Stat(dnsmasqBinary); err != nil {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s=1 but there is no %s (Debian's dnsmasq-base; make deps-test installs it)", RequireEnv, dnsmasqBinary)
		}
		t.Skipf("no %s (Debian's dnsmasq-base): make deps-test installs it; %s=1 makes this a failure", dnsmasqBinary, RequireEnv)
	}
	d := &Server{t: t, dir: t.TempDir(), port: freeUDPAndTCPPort(t)}
	d.conf = filepath.Join(d.dir, "dnsmasq.conf")
	d.hosts = filepath.Join(d.dir, "hosts")
	d.writeFile(d.conf, conf)
	d.writeFile(d.hosts, hosts)
	t.Cleanup(d.Stop)
	if err := d.run(); err != nil {
		t.Fatal(err)
	}
	return d
}

// freeUDPAndTCPPort returns a loopback port free for both UDP and TCP a moment ago.
func freeUDPAndTCPPort(t testing.TB) int {
	t.Helper()
	for range 20 {
		port, err := freeport.Loopback()
		if err != nil {
			t.Fatal(err)
		}
		c, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = c.Close()
			return port
		}
	}
	t.Fatal("cannot find a loopback port free for UDP and TCP")
	return 0
}

// Addr is the server's "127.0.0.1:port".
func (d *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(d.port)) }

// args are dnsmasq's flags: in the foreground, only on the test's port of 127.0.0.1, answering from its
// files alone. --user keeps dnsmasq as the test's own user (run as root it would switch to nobody, who
// need not be able to read the test's 0700 temporary directory when SIGHUP has it read the hosts file
// again); --pid-file is one of its own, not /run's. --local-ttl=1 is the TTL of every answer from those
// files, srv-host records and the additional section included (dnsmasq's default is 0); --local=/test/
// answers a missing name under .test with NXDOMAIN, where dnsmasq without upstream servers says REFUSED.
func (d *Server) args() []string {
	u := "root"
	if cur, err := user.Current(); err == nil {
		u = cur.Username
	}
	return []string{
		"--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces",
		"--listen-address=127.0.0.1", "--port=" + strconv.Itoa(d.port),
		"--conf-file=" + d.conf, "--addn-hosts=" + d.hosts,
		"--pid-file=" + filepath.Join(d.dir, "dnsmasq.pid"), "--user=" + u,
		"--local-ttl=1", "--local=/test/", "--log-queries", "--log-facility=-",
	}
}

// run starts the stopped server on its port and waits until it answers.
func (d *Server) run() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		return errors.New("BUG: dnsmasq is running already")
	}
	logf, err := os.OpenFile(filepath.Join(d.dir, "dnsmasq.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(dnsmasqBinary, d.args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the test binary, whatever way that ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start dnsmasq: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if err := d.awaitAnswer(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return err
	}
	d.cmd, d.exited = cmd, exited
	return nil
}

// awaitAnswer waits until the server answers a query, or exits.
func (d *Server) awaitAnswer(exited chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if answers(d.Addr()) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("dnsmasq exited at start: %s", d.Log())
		case <-time.After(10 * time.Millisecond):
		}
	}
	return fmt.Errorf("dnsmasq does not answer on %s after 10s: %s", d.Addr(), d.Log())
}

// answers reports whether a DNS server at addr answers a query over UDP.
func answers(addr string) bool {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1, RecursionDesired: true})
	_ = b.StartQuestions()
	_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("ready.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	req, err := b.Finish()
	if err != nil {
		return false
	}
	_ = c.SetDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Write(req); err != nil {
		return false
	}
	buf := make([]byte, 512)
	_, err = c.Read(buf)
	return err == nil
}

// Log is what dnsmasq wrote, for failures.
func (d *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(d.dir, "dnsmasq.log"))
	return strings.TrimSpace(string(b))
}

// Stop kills the server and waits for it to exit; a stopped server is left alone.
func (d *Server) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

// Restart stops the server, gives it conf as its conf file, and starts it again on the same port (dnsmasq
// reads srv-host lines only at start).
func (d *Server) Restart(conf string) {
	d.t.Helper()
	d.Stop()
	d.writeFile(d.conf, conf)
	if err := d.run(); err != nil {
		d.t.Fatal(err)
	}
}

// SetHosts gives the server hosts as its addn-hosts file and has it read it again (SIGHUP).
func (d *Server) SetHosts(hosts string) {
	d.t.Helper()
	d.writeFile(d.hosts, hosts)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		d.t.Fatal(err)
	}
}

func (d *Server) writeFile(path, content string) {
	d.t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		d.t.Fatal(err)
	}
}
