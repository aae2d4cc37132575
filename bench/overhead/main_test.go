package overhead

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
