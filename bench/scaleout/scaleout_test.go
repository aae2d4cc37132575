package scaleout

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/internal/haproxytest"
	"github.com/rolter-ai/rolter/loadtest"
)

// TestMain lets the test binary stand in for bin/rolter in TestScaleoutTiny (fleet.StandIn).
func TestMain(m *testing.M) {
	fleet.StandIn()
	os.Exit(m.Run())
}

// binaries returns the haproxy binary and the gateway binary (ROLTER_BIN, else this test
// binary, see TestMain), or skips the test without haproxy unless ROLTER_REQUIRE_HAPROXY=1.
func binaries(t *testing.T) (haproxy, rolter string) {
	t.Helper()
	o := Options{Rolter: "x"}
	if err := o.normalize(); errors.Is(err, ErrNoHAProxy) {
		if os.Getenv("ROLTER_REQUIRE_HAPROXY") == "1" {
			t.Fatalf("ROLTER_REQUIRE_HAPROXY=1: %s", err)
		}
		t.Skipf("%s", err)
	}
	if rolter = os.Getenv("ROLTER_BIN"); rolter != "" {
		return o.HAProxy, rolter
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("cannot find the test binary: %s", err)
	}
	return o.HAProxy, self
}

// TestScaleoutTiny runs the scale-out report end to end on a tiny fleet: gateway processes (this
// binary serving as `rolter serve`, or ROLTER_BIN) behind a real HAProxy. Requests must reach both gateways of the 2-gateway cell (HAProxy
// balances the client's connections), the gateways' counters must add up to the client's requests,
// the report must render, and no process may outlive its cell.
func TestScaleoutTiny(t *testing.T) {
	haproxy, rolter := binaries(t)
	// The cluster variant needs a nats-server: without one the plain strategy runs, unless
	// ROLTER_REQUIRE_NATS=1 (make test), when that is a failure.
	strategy := GoalStrategy
	if fleet.LookSbin("nats-server") == "" {
		if os.Getenv("ROLTER_REQUIRE_NATS") == "1" {
			t.Fatal("ROLTER_REQUIRE_NATS=1: nats-server not found")
		}
		strategy = "cache_aware"
	}
	w := loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: 1, Groups: 4, PromptsPerGroup: 8, Popularity: loadtest.Uniform,
		SystemTokens: 48, QuestionTokens: 4, OutputTokens: 2}
	start := time.Now()
	rep, err := Run(context.Background(), Options{
		Rolter: rolter, HAProxy: haproxy, Gateways: []int{1, 2}, Engines: 2, Scale: 16, MaxNumSeqs: 2, Concurrency: 4,
		PrefillPerToken: time.Microsecond, DecodePerToken: 100 * time.Microsecond,
		Strategies: []string{strategy, "no_such_strategy"}, Scenarios: []string{loadtest.SharedPrefix},
		Workloads: map[string]loadtest.Workload{loadtest.SharedPrefix: w}, Repeats: 1, RunTimeout: 30 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("report in %s", time.Since(start))
	if len(rep.Runs) != 4 {
		t.Fatalf("%d runs, want 4 (2 strategies × 2 gateway counts)", len(rep.Runs))
	}
	for _, run := range rep.Runs {
		checkTrial(t, run, strategy)
	}
	dir := t.TempDir()
	files, err := Write(rep, dir)
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Goals", GoalStrategy + " token hit rate, 2 gateways vs 1 (shared-prefix)", "| " + strategy + " | 2 |",
		"no_such_strategy | 1 | not available in this build", "make bench-scaleout"} {
		if !strings.Contains(string(md), want) {
			t.Fatalf("scaleout.md lacks %q:\n%s", want, md)
		}
	}
	back, err := Load(files[1])
	if err != nil {
		t.Fatal(err)
	}
	if back.Markdown() != rep.Markdown() {
		t.Fatal("the report rendered from its JSON differs")
	}
}

// checkTrial checks one cell of TestScaleoutTiny: its processes are gone, the unknown strategy did not
// run, and in the others every gateway got requests and the gateways' and the engines' counters add up to
// the client's.
func checkTrial(t *testing.T, run *Trial, strategy string) {
	t.Helper()
	for _, pid := range run.pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("%s/%d gw: process %d still there after its cell (kill 0: %v)", run.Strategy, run.Gateways, pid, err)
		}
	}
	if run.Strategy == "no_such_strategy" {
		if !strings.Contains(run.Unavailable, "not available in this build") || len(run.pids) != 0 {
			t.Fatalf("unknown strategy: unavailable %q, error %q, %d processes", run.Unavailable, run.Error, len(run.pids))
		}
		return
	}
	if !run.Available() {
		t.Fatalf("%d gw did not run: %s", run.Gateways, run.Error)
	}
	procs := run.Gateways + 1 // and HAProxy
	if strategy == GoalStrategy {
		procs++ // nats-server
	}
	if len(run.pids) != procs {
		t.Fatalf("%d gw: %d processes started, want %d", run.Gateways, len(run.pids), procs)
	}
	r := run.Result
	if r.Succeeded != r.Planned || r.Failed != 0 {
		t.Fatalf("%d gw: %d of %d ok, %v", run.Gateways, r.Succeeded, r.Planned, r.Errors)
	}
	if len(run.GatewayRequests) != run.Gateways || len(run.GatewayConnections) != run.Gateways {
		t.Fatalf("%d gw: requests per gateway %v, connections %v", run.Gateways, run.GatewayRequests, run.GatewayConnections)
	}
	for i := range run.GatewayRequests {
		if run.GatewayRequests[i] == 0 || run.GatewayConnections[i] == 0 {
			t.Fatalf("%d gw: gateway %d got no request: requests %v, connections %v", run.Gateways, i+1, run.GatewayRequests, run.GatewayConnections)
		}
	}
	if got := sumInts(run.GatewayRequests); got != r.Succeeded {
		t.Fatalf("%d gw: the gateways counted %d requests, the client %d", run.Gateways, got, r.Succeeded)
	}
	if got := sumInts(run.EngineRequests); got != r.Succeeded || len(run.EngineRequests) != 2 {
		t.Fatalf("%d gw: engines got %v, the client sent %d", run.Gateways, run.EngineRequests, r.Succeeded)
	}
}

func TestParseHAProxySessions(t *testing.T) {
	const stat = "# pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,\n" +
		"fe,FRONTEND,,,0,3,4096,40,1,\n" +
		"gateways,gw1,0,0,0,2,,21,1,\n" +
		"gateways,gw2,0,0,0,2,,19,1,\n" +
		"gateways,BACKEND,0,0,0,3,410,40,1,\n"
	f := func(stat string, n int, want []int, wantErr string) {
		t.Helper()
		got, err := parseHAProxySessions([]byte(stat), n)
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("got %v, %v; want error %q", got, err, wantErr)
			}
			return
		}
		if err != nil || joinInts(got) != joinInts(want) {
			t.Fatalf("got %v, %v; want %v", got, err, want)
		}
	}
	f(stat, 2, []int{21, 19}, "")
	f(stat, 3, nil, "2 of 3 gateways")
	f("# pxname,svname\n", 1, nil, "no stot column")
	f("", 1, nil, "empty")
}

func TestParseGatewayMetrics(t *testing.T) {
	body := `# TYPE rolter_requests_total counter
rolter_requests_total{route="m",target="sim-1",code="200"} 7
rolter_requests_total{route="m",target="sim-2",code="200"} 5
rolter_requests_total{route="m",target="",code="404"} 1
rolter_prompt_tokens_total{route="m",target="sim-1"} 400
rolter_cached_tokens_total{route="m",target="sim-1"} 300
rolter_kv_events_total{target="sim-1",kind="stored"} 10
rolter_kv_events_total{target="sim-1",kind="removed"} 2
rolter_kv_events_total{target="sim-2",kind="stored"} 0
rolter_requests_totally_else 99
`
	st := parseGatewayMetrics([]byte(body))
	if st.Requests != 13 || st.hitRate() != 0.75 || st.KVEvents != 12 || st.KVTargets != 1 {
		t.Fatalf("got %+v", st)
	}
	if st := parseGatewayMetrics(nil); st.Requests != 0 || st.hitRate() != 0 {
		t.Fatalf("empty body: %+v", st)
	}
}

func TestCoV(t *testing.T) {
	f := func(vs []float64, want float64) {
		t.Helper()
		if got := cov(vs); got < want-1e-9 || got > want+1e-9 {
			t.Fatalf("cov(%v) = %v, want %v", vs, got, want)
		}
	}
	f(nil, 0)
	f([]float64{0, 0}, 0)
	f([]float64{4, 4, 4}, 0)
	f([]float64{2, 4}, 1.0/3) // mean 3, stddev 1
	f([]float64{0, 0, 0, 8}, 1.7320508075688772)
}

// trial is a cell of the goal strategy that measured hit and engineCoV.
func trial(scenario string, gateways int, hit, engineCoV float64) *Trial {
	return &Trial{Scenario: scenario, Strategy: GoalStrategy, Gateways: gateways, EngineCoV: engineCoV,
		Result: &loadtest.Result{HitRate: hit}}
}

func TestScaleoutGoals(t *testing.T) {
	f := func(gateways []int, runs []*Trial, want ...string) {
		t.Helper()
		goals := goalsOf(&Report{Options: ReportOptions{Gateways: gateways}, Runs: runs})
		var got []string
		for _, g := range goals {
			got = append(got, g.Verdict)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Fatalf("verdicts %v, want %v: %+v", got, want, goals)
		}
	}
	sp, mt := loadtest.SharedPrefix, loadtest.MultiTurn
	// Order: shared-prefix hit, CoV; multi-turn hit, CoV. Medians over repeats: 0.70 vs 0.68 loses 2 points.
	f([]int{1, 2, 4}, []*Trial{
		trial(sp, 1, 0.70, 0.05), trial(sp, 1, 0.72, 0.04), trial(sp, 1, 0.60, 0.30),
		trial(sp, 4, 0.68, 0.14), trial(sp, 4, 0.20, 0.10), trial(sp, 4, 0.69, 0.15),
		trial(mt, 1, 0.80, 0.05), trial(mt, 4, 0.60, 0.30), trial(mt, 2, 0.79, 0.05),
	}, "PASS", "PASS", "MISS", "MISS")
	// Exactly 3 points and exactly 0.1 pass; the 2-gateway cell is not the one judged.
	f([]int{1, 2, 4}, []*Trial{
		trial(sp, 1, 0.50, 0.10), trial(sp, 4, 0.47, 0.20), trial(sp, 2, 0.10, 0.90),
		{Scenario: mt, Strategy: GoalStrategy, Gateways: 1, Error: "boom"}, trial(mt, 4, 0.6, 0.1),
	}, "PASS", "PASS", "n/a", "n/a")
	f([]int{2, 4}, []*Trial{trial(sp, 2, 0.5, 0), trial(sp, 4, 0.5, 0)}, "n/a", "n/a", "n/a", "n/a")
}

// TestHAProxyConfig: the template renders a cell's config line for line, one server per gateway, and
// HAProxy accepts it when it is installed; the gateways' config gets its short drain.
func TestHAProxyConfig(t *testing.T) {
	f := func(gateways []string, servers string) {
		t.Helper()
		cfg, err := haproxyConfig("127.0.0.1:9000", gateways, "/d/p", "/d/s")
		if err != nil {
			t.Fatal(err)
		}
		want := `# scale-out report: an L4 balancer in front of the gateways
global
    maxconn 4096
    pidfile /d/p
    stats socket /d/s mode 600 level user

defaults
    mode tcp
    timeout connect 5s
    timeout client 5m
    timeout server 5m

frontend fe
    bind 127.0.0.1:9000
    default_backend gateways

backend gateways
    balance roundrobin
` + servers
		if cfg != want {
			t.Fatalf("config:\n%s\nwant:\n%s", cfg, want)
		}
		if len(gateways) > 0 {
			dir := t.TempDir()
			cfg, err := haproxyConfig("127.0.0.1:9000", gateways, filepath.Join(dir, "p"), filepath.Join(dir, "s"))
			if err != nil {
				t.Fatal(err)
			}
			haproxytest.Check(t, cfg)
		}
	}
	f(nil, "")
	f([]string{"http://127.0.0.1:9001"}, "    server gw1 127.0.0.1:9001\n")
	f([]string{"http://127.0.0.1:9001", "http://127.0.0.1:9002"}, "    server gw1 127.0.0.1:9001\n    server gw2 127.0.0.1:9002\n")

	if c := gatewayConfig("127.0.0.1:1", "cache_aware", []string{"http://127.0.0.1:2"}, []string{""}, "m"); !strings.Contains(c, "[server]\ndrain_secs = 2\nlisten = ") {
		t.Fatalf("gateway config:\n%s", c)
	}
}
