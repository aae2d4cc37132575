//go:build !cgo

package sim

import (
	"strings"
	"testing"
)

func TestKVEventsNeedCgo(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "without cgo") {
		t.Fatalf("New with kv events and no cgo: %v", err)
	}
	// HTTP alone works.
	e := startEngine(t, testConfig())
	c := newClient(t, 0)
	if status, _ := c.completion(e.URL()+"/v1/completions", `{"prompt":"x"}`); status != 200 {
		t.Fatalf("status %d", status)
	}
}
