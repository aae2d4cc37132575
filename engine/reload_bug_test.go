package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestReloadRefusesBuildPanic: a bug that panics while a snapshot is built refuses the reload with a
// "BUG:" error instead of killing the process (SIGHUP) or every later write (the control plane): the
// running config keeps serving, what the failed build made is released, and the next reload works.
func TestReloadRefusesBuildPanic(t *testing.T) {
	config.Strategies["test_panic"] = config.StrategySpec{}
	strategies["test_panic"] = func(*Route, config.RouteParams, *buildEnv) (Strategy, error) {
		panic("test_panic strategy")
	}
	defer delete(strategies, "test_panic")
	defer delete(config.Strategies, "test_panic")
	up, other := newFakeUpstream(t, okJSON), newFakeUpstream(t, okJSON)
	text := gatewayConfig("round_robin", "", up.URL)
	gw := startGateway(t, text)
	before := gw.g.Snapshot()
	path := filepath.Join(t.TempDir(), "rolter.toml")
	// A second provider too, so the failed build has made a provider of its own to release.
	bad := gatewayConfig("test_panic", "", up.URL, other.URL)
	if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	err := gw.g.ReloadFile(path)
	if err == nil || !strings.Contains(err.Error(), "BUG:") || !strings.Contains(err.Error(), "test_panic strategy") {
		t.Fatalf("reload whose build panics: %v", err)
	}
	if gw.g.Snapshot() != before {
		t.Fatal("a reload whose build panicked replaced the live snapshot")
	}
	if len(gw.g.series) != len(before.series) {
		t.Fatalf("the failed build left %d metric series, want the live snapshot's %d", len(gw.g.series), len(before.series))
	}
	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
		t.Fatalf("after the refused reload: %d %s", resp.StatusCode, got)
	}
	mustReload(t, gw, gatewayConfig("least_load", "", up.URL, other.URL))
	if got := gw.g.Snapshot().Routes[0].StrategyName; got != "least_load" {
		t.Fatalf("the reload after the refused one runs %s", got)
	}
	if m := metricsText(t, gw); !strings.Contains(m, `rolter_config_reloads_total{result="failed"} 1`) {
		t.Fatalf("/metrics does not count the refused reload:\n%s", grepLines(m, "rolter_config"))
	}
}
