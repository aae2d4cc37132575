package engine

import (
	"maps"
	"slices"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestStrategiesMatchConfig: the engine builds every strategy the config package validates, and no other,
// so a route that passes `rolter check` always builds.
func TestStrategiesMatchConfig(t *testing.T) {
	built := slices.Sorted(maps.Keys(strategies))
	known := slices.Sorted(maps.Keys(config.Strategies))
	if !slices.Equal(built, known) {
		t.Fatalf("engine builds %v, config knows %v", built, known)
	}
}
