package config

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/kvindex"
)

// TestExampleConfigs loads every file in configs/: the examples users copy must stay valid.
func TestExampleConfigs(t *testing.T) {
	files, err := filepath.Glob("../configs/*.toml")
	if err != nil || len(files) < 4 {
		t.Fatalf("example configs missing: %v %v", files, err)
	}
	for _, f := range files {
		_, err := Load(f)
		if err != nil && !kvindex.Supported && strings.Contains(err.Error(), "needs a build with cgo") {
			continue // kv_events examples need cgo
		}
		if err != nil {
			t.Fatalf("%s: %s", f, err)
		}
	}
}
