package control

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestStrategySummaries: what the dashboard says of precise_cache_aware's fallback is what the engine does
// (engine/precise_fallback_test.go pins it): a target without exact evidence is scored by its approximate
// prefix trie, and only with no evidence at all does load decide.
func TestStrategySummaries(t *testing.T) {
	b, err := dashboardFiles.ReadFile("dashboard/strategies.json")
	if err != nil {
		t.Fatal(err)
	}
	var specs map[string]struct{ Summary string }
	if err := json.Unmarshal(b, &specs); err != nil {
		t.Fatal(err)
	}
	s := specs["precise_cache_aware"].Summary
	if !strings.Contains(s, "approximate prefix trie") || strings.Contains(s, "is ranked by load") {
		t.Fatalf("precise_cache_aware's summary %q does not say it falls back to the approximate trie", s)
	}
}
