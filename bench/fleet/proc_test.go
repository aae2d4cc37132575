package fleet

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestReadRSS(t *testing.T) {
	rss, err := ReadRSS(os.Getpid())
	if err != nil {
		t.Skipf("no /proc: %s", err)
	}
	if rss < 1<<20 || rss > 1<<40 {
		t.Fatalf("RSS %d bytes is implausible", rss)
	}
	if _, err := ReadRSS(1 << 30); err == nil {
		t.Fatal("RSS of a pid that cannot exist")
	}
}

// TestProcStop: a child is started, its ready line read, and stopped by PID.
func TestProcStop(t *testing.T) {
	p, rest, err := StartProc("sleeper", "/bin/sh", []string{"-c", "echo 'listening http://127.0.0.1:9'; exec sleep 30"}, "listening http://", 5*time.Second)
	if err != nil {
		t.Skipf("no /bin/sh: %s", err)
	}
	if rest != "127.0.0.1:9" {
		t.Fatalf("ready line rest %q", rest)
	}
	if !p.Alive() {
		t.Fatal("child not alive")
	}
	start := time.Now()
	p.Stop()
	if p.Alive() {
		t.Fatal("child alive after stop")
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("stop took %v: SIGTERM ignored?", took)
	}
	p.Stop() // idempotent

	_, _, err = StartProc("quitter", "/bin/sh", []string{"-c", "echo boom >&2; exit 3"}, "listening", 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("got %v; want the child's output in the error", err)
	}
}
