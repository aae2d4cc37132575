package main

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFileRouteWinsOverOrgRoute: an org's route takes model "m"; the operator then routes "m" in the
// file and sends SIGHUP. The reload applies (the file's route serves "m" to anyone), and the org's route
// is set aside and shown as suspended, not the reason the whole reload is refused.
func TestFileRouteWinsOverOrgRoute(t *testing.T) {
	s := serveControl(t)
	if c, p := s.chat(s.key); c != 200 || p != s.org+"/p" {
		t.Fatalf("the org's route: %d from %q", c, p)
	}

	os.WriteFile(s.cfg, []byte(s.head+"[[providers]]\nname = \"filep\"\napi_base = \"http://"+s.upstream+
		"\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"filep\"\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	var c int
	var p string
	for i := 0; i < 100; i++ {
		if c, p = s.chat(""); c == 200 && p == "filep" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c != 200 || p != "filep" {
		t.Fatalf("after the operator's reload, model m answers %d from %q: want the file's route", c, p)
	}
	if code, got := s.api("GET", "/api/v1/state", ""); code != 200 || !strings.Contains(got, `"suspended_routes":[{"org":"`+s.org+`","model":"m"`) {
		t.Fatalf("state %d: %s", code, got)
	}
	if code, got := s.api("GET", s.base+"/routes/m", ""); code != 200 || !strings.Contains(got, `"suspended":"rolter.toml routes this model`) {
		t.Fatalf("the org's route view %d: %s", code, got)
	}
	s.stop()
}
