// Package haproxytest checks HAProxy configs the reports render, for their tests: `haproxy -c` on the
// text, when HAProxy is installed (it must be under ROLTER_REQUIRE_HAPROXY=1, which make test sets).
package haproxytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// Check runs `haproxy -c` on text and fails t if HAProxy refuses it.
func Check(t testing.TB, text string) {
	t.Helper()
	h := fleet.LookSbin("haproxy")
	if h == "" {
		if os.Getenv("ROLTER_REQUIRE_HAPROXY") == "1" {
			t.Fatal("ROLTER_REQUIRE_HAPROXY=1: haproxy not found")
		}
		t.Log("haproxy not installed: config not checked by it")
		return
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(h, "-c", "-q", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %s\n%s\n%s", err, out, text)
	}
}
