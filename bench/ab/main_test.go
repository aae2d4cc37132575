package ab

import (
	"os"
	"testing"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// TestMain lets the test binary stand in for bin/rolter (fleet.StandIn).
func TestMain(m *testing.M) {
	fleet.StandIn()
	os.Exit(m.Run())
}

// startUpstream serves the fake upstream on a loopback port for the test's duration.
func startUpstream(t *testing.T, cfg fleet.UpstreamConfig) string {
	t.Helper()
	addr, stop, err := fleet.ServeFakeUpstream(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}
