package loadtest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/sim"
)

// TestEndToEnd runs shared-prefix through a cache_aware gateway in front of 2 simulated engines
// and checks what the harness reports against the engines' own counters.
func TestEndToEnd(t *testing.T) {
	var sims []*sim.Engine
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i := 0; i < 2; i++ {
		cfg := sim.DefaultConfig()
		cfg.PrefillPerToken, cfg.DecodePerToken = 5*time.Microsecond, 200*time.Microsecond
		e, err := sim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Stop)
		sims = append(sims, e)
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n", i+1, e.URL())
	}
	b.WriteString("[[routes]]\nmodel = \"sim-model\"\nstrategy = \"cache_aware\"\n")
	for i := range sims {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"sim-%d\"\n", i+1)
	}
	cfg, err := config.Parse([]byte(b.String()), "e2e.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := engine.New(cfg, engine.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		<-served
	})

	w := Workload{Scenario: SharedPrefix, Seed: 1, Groups: 4, PromptsPerGroup: 6, SystemTokens: 64, QuestionTokens: 8, OutputTokens: 4, Popularity: Uniform}
	res, err := Run(context.Background(), Options{
		URL: "http://" + ln.Addr().String(), Workload: w, Concurrency: 2, Duration: 30 * time.Second,
		TokenIDs: true, TokenizeURL: sims[0].URL(), Targets: []string{"sim-1", "sim-2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + res.Markdown())
	if res.Succeeded != 24 || res.Failed != 0 {
		t.Fatalf("ok %d failed %d %v; want 24, 0", res.Succeeded, res.Failed, res.Errors)
	}
	var queried, hits uint64
	for _, e := range sims {
		st := e.Stats()
		queried += st.QueriedTokens
		hits += st.HitTokens
	}
	if uint64(res.PromptTokens) != queried || uint64(res.CachedTokens) != hits {
		t.Fatalf("harness counted %d/%d cached/prompt tokens, engines %d/%d", res.CachedTokens, res.PromptTokens, hits, queried)
	}
	if res.HitRate <= 0 || res.HitRate > res.OracleHitRate+1e-9 {
		t.Fatalf("hit rate %.3f outside (0, oracle %.3f]", res.HitRate, res.OracleHitRate)
	}
	if want := float64(4*5*16*4) / float64(24*(64+8+TemplateTokens)); res.OracleHitRate != want {
		t.Fatalf("oracle %.4f, want %.4f", res.OracleHitRate, want)
	}
	if len(res.Targets) != 2 || res.Targets[0].Requests+res.Targets[1].Requests != 24 {
		t.Fatalf("targets %+v", res.Targets)
	}
	if res.Decisions["prefix_hit"] == 0 {
		t.Fatalf("no prefix_hit decisions: %v", res.Decisions)
	}
	if res.TTFT.P50 <= 0 || res.Latency.P50 < res.TTFT.P50 {
		t.Fatalf("TTFT %+v latency %+v", res.TTFT, res.Latency)
	}
}
