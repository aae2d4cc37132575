//go:build cgo

package engine

import (
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
	"github.com/rolter-ai/rolter/sim"
)

// TestKVSilenceLogged: a sim and a gateway that both connect (neither binds) exchange no KV event while
// the engine serves; the gateway logs that with the likely cause. Wired right (the sim binds), it does not.
func TestKVSilenceLogged(t *testing.T) {
	defer func(n int) { kvSilentTicks = n }(kvSilentTicks)
	kvSilentTicks = 2
	run := func(simBinds bool) string {
		t.Helper()
		port, err := freeport.Loopback()
		if err != nil {
			t.Fatal(err)
		}
		endpoint := fmt.Sprintf("tcp://127.0.0.1:%d", port)
		engines, _ := simFleet(t, 1, func(c *sim.Config) {
			c.KVEvents = endpoint // a host and port: the sim connects, as vLLM does
			if simBinds {
				c.KVEvents = "tcp://127.0.0.1:*" // a wildcard: the sim binds
			}
			c.DecodePerToken = 100 * time.Millisecond
			c.MaxTokens = 40
		})
		if simBinds {
			endpoint = engines[0].KVEventsEndpoint()
		}
		text := fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[[providers]]\nname = \"sim-0\"\napi_base = %q\n"+
			"[providers.kv_events]\nendpoint = %q\n"+
			"[[routes]]\nmodel = \"m\"\nstrategy = \"precise_cache_aware\"\n[[routes.targets]]\nprovider = \"sim-0\"\nmodel = \"sim-model\"\n",
			engines[0].URL(), endpoint)
		logs := &syncbuf.Buffer{}
		gw := startGatewayWith(t, text, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
		// Requests in flight on the engine for ~4 janitor ticks.
		var wg sync.WaitGroup
		for i := 0; i < 2; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				post(t, gw.URL+"/v1/chat/completions", chatBody("m", strings.Repeat("a long prompt for the engine ", 8), true))
			}()
		}
		wg.Wait()
		return logs.String()
	}
	// The sim connects (a host, no wildcard) and so does the gateway (the default mode).
	silent := run(false)
	if !strings.Contains(silent, "no KV event received while the engine serves requests") ||
		!strings.Contains(silent, "both sides connect") || strings.Count(silent, "no KV event received") != 1 {
		t.Fatalf("both sides connecting: want one warning with the cause, got:\n%s", silent)
	}
	// The sim binds: events flow, no warning.
	wired := run(true)
	if strings.Contains(wired, "no KV event received") {
		t.Fatalf("wired right, yet warned:\n%s", wired)
	}
}
