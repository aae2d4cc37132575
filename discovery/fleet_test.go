package discovery

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

// handWatcher is a source the test drives by hand: it hands the test the Sink it is given.
type handWatcher struct {
	sinks   chan Sink
	stopped chan string
	name    string
}

func (h *handWatcher) Watch(ctx context.Context, sink Sink) {
	h.sinks <- sink
	<-ctx.Done()
	h.stopped <- h.name
}

const fleetBase = `
[[sources]]
name = "pool"
kind = "dns"
port = 8000
settle_secs = %v
[sources.dns]
name = "vllm.test"
record = "a"
[sources.provider]
api_base = "http://{ip}:{port}/v1"
[[providers]]
name = "fixed"
api_base = "http://127.0.0.1:9"
[[routes]]
model = "m"
strategy = "cache_aware"
[[routes.targets]]
provider = "fixed"
[[routes.targets]]
source = "pool"
model = "llama"
`

func parseBase(t *testing.T, settle float64) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(fmt.Sprintf(fleetBase, settle)), "fleet.toml")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func ep(ip string, ready bool) Endpoint {
	return Endpoint{Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), 8000), Ready: ready, Name: ip}
}

// applied records every config the fleet applies, after checking it is valid.
type applied struct {
	mu   sync.Mutex
	cfgs []*config.Config
	t    *testing.T
}

func (a *applied) apply(cfg *config.Config) error {
	if errs := config.Validate(cfg); len(errs) > 0 {
		a.t.Errorf("the fleet applied an invalid config: %v", errs)
		return errs
	}
	a.mu.Lock()
	a.cfgs = append(a.cfgs, cfg)
	a.mu.Unlock()
	return nil
}

func (a *applied) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.cfgs)
}

// targets returns the providers of route m's targets in the last config applied.
func (a *applied) targets() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return targetsOf(a.cfgs[len(a.cfgs)-1])
}

func targetsOf(cfg *config.Config) string {
	var names []string
	for _, t := range cfg.Routes[0].Targets {
		names = append(names, t.Provider)
	}
	return strings.Join(names, " ")
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newHandFleet(t *testing.T) (*Fleet, *handWatcher) {
	h := &handWatcher{sinks: make(chan Sink, 4), stopped: make(chan string, 4), name: "pool"}
	f := New(Options{
		NewWatcher: func(sc *config.SourceConfig) (Watcher, error) { return h, nil },
		Interval:   20 * time.Millisecond,
		SyncWait:   2 * time.Second,
	})
	t.Cleanup(f.Close)
	return f, h
}

// TestFleetFollowsItsSource: the fleet starts with the set the source reports first, takes a new
// endpoint after its settle time, drops one that stops being ready at once, keeps the last set when the
// source fails, and stops the watcher of a source the config no longer names.
func TestFleetFollowsItsSource(t *testing.T) {
	f, h := newHandFleet(t)
	base := parseBase(t, 0.3)
	var sink Sink
	go func() {
		sink = <-h.sinks
		sink.Set([]Endpoint{ep("10.0.0.2", true), ep("10.0.0.1", true), ep("10.0.0.9", false)})
	}()
	cfg, err := f.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(cfg), "fixed pool@10.0.0.1:8000 pool@10.0.0.2:8000"; got != want {
		t.Fatalf("first config: targets %q, want %q", got, want)
	}
	if p := cfg.Providers[1]; p.APIBase != "http://10.0.0.1:8000/v1" || cfg.Routes[0].Targets[1].Model != "llama" {
		t.Fatalf("provider %+v, target %+v", p, cfg.Routes[0].Targets[1])
	}
	a := &applied{t: t}
	f.Attach(a.apply)

	sink.Set([]Endpoint{ep("10.0.0.1", true), ep("10.0.0.2", true), ep("10.0.0.3", true)})
	added := time.Now()
	time.Sleep(100 * time.Millisecond)
	if a.count() > 0 && strings.Contains(a.targets(), "10.0.0.3") {
		t.Fatal("a new endpoint took traffic before its settle time")
	}
	waitFor(t, "the new endpoint to settle", func() bool { return a.count() > 0 && strings.Contains(a.targets(), "10.0.0.3") })
	if d := time.Since(added); d < 300*time.Millisecond {
		t.Fatalf("the new endpoint settled after %v, under settle_secs", d)
	}
	n := a.count()
	sink.Set([]Endpoint{ep("10.0.0.1", false), ep("10.0.0.2", true), ep("10.0.0.3", true)})
	waitFor(t, "the unready endpoint to leave", func() bool { return a.count() > n })
	if got, want := a.targets(), "fixed pool@10.0.0.2:8000 pool@10.0.0.3:8000"; got != want {
		t.Fatalf("targets %q, want %q", got, want)
	}

	n = a.count()
	sink.Fail(fmt.Errorf("dns server down"))
	time.Sleep(100 * time.Millisecond)
	if a.count() != n {
		t.Fatal("a failing source changed the config")
	}
	st := f.Status()
	if len(st) != 1 || st[0].Up || st[0].LastError != "dns server down" || st[0].States[StateLive] != 2 || st[0].States[StateNotReady] != 1 {
		t.Fatalf("status %+v", st)
	}
	unregister := f.RegisterMetrics()
	var exposition strings.Builder
	telemetry.WritePrometheus(&exposition)
	unregister()
	for _, want := range []string{
		"# TYPE rolter_discovery_endpoints gauge\n",
		`rolter_discovery_endpoints{source="pool",state="live"} 2` + "\n",
		`rolter_discovery_endpoints{source="pool",state="not_ready"} 1` + "\n",
		`rolter_discovery_source_up{source="pool"} 0` + "\n",
		"# TYPE rolter_discovery_errors_total counter\n",
		`rolter_discovery_errors_total{source="pool"} 1` + "\n",
		"rolter_discovery_apply_failed 0\n",
	} {
		if !strings.Contains(exposition.String(), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, exposition.String())
		}
	}

	// A burst of changes is coalesced: far fewer configs than changes.
	n = a.count()
	for i := range 200 {
		eps := []Endpoint{ep("10.0.0.2", true), ep("10.0.0.3", true)}
		if i%2 == 0 {
			eps = eps[:1]
		}
		sink.Set(eps)
	}
	sink.Set([]Endpoint{ep("10.0.0.2", true)})
	waitFor(t, "the burst to be applied", func() bool { return a.targets() == "fixed pool@10.0.0.2:8000" })
	time.Sleep(60 * time.Millisecond)
	if got := a.count() - n; got > 10 {
		t.Fatalf("200 changes made %d configs", got)
	}

	// A config without the source stops its watcher.
	plain, err := config.Parse([]byte("[[providers]]\nname = \"fixed\"\napi_base = \"http://127.0.0.1:9\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"fixed\"\n"), "plain.toml")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(plain); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.stopped:
	case <-time.After(2 * time.Second):
		t.Fatal("the watcher of a dropped source was not stopped")
	}
}

// TestFleetEmptySource: a source that finds nothing leaves its route without targets, a valid config
// the gateway answers 503 for; a new pod on a reused address is a new target.
func TestFleetEmptySource(t *testing.T) {
	f, h := newHandFleet(t)
	base := parseBase(t, 0)
	base.Routes[0].Targets = base.Routes[0].Targets[1:] // the source alone
	go func() { (<-h.sinks).Set(nil) }()
	cfg, err := f.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatal(errs)
	}
	if n := len(cfg.Routes[0].Targets); n != 0 || len(cfg.Routes[0].Discovered) != 1 {
		t.Fatalf("route %+v", cfg.Routes[0])
	}
	a := &applied{t: t}
	f.Attach(a.apply)
	f.applyMu.Lock()
	sink := f.sources["pool"]
	f.applyMu.Unlock()
	e := ep("10.0.0.1", true)
	e.UID = "aaaaaaaa-1111"
	sink.Set([]Endpoint{e})
	waitFor(t, "the endpoint", func() bool { return a.count() > 0 && a.targets() == "pool@10.0.0.1:8000/aaaaaaaa" })
	e.UID = "bbbbbbbb-2222"
	sink.Set([]Endpoint{e})
	waitFor(t, "the new pod", func() bool { return a.targets() == "pool@10.0.0.1:8000/bbbbbbbb" })
}

// TestFleetCapsEndpoints: a source gives a route at most max_endpoints targets, in address order, and
// the route at most config.MaxTargets.
func TestFleetCapsEndpoints(t *testing.T) {
	f, h := newHandFleet(t)
	base := parseBase(t, 0)
	base.Sources[0].MaxEndpoints = 2
	go func() {
		(<-h.sinks).Set([]Endpoint{ep("10.0.0.3", true), ep("10.0.0.1", true), ep("10.0.0.2", true)})
	}()
	cfg, err := f.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := targetsOf(cfg), "fixed pool@10.0.0.1:8000 pool@10.0.0.2:8000"; got != want {
		t.Fatalf("targets %q, want %q", got, want)
	}
	if st := f.Status(); st[0].States[StateCapped] != 1 {
		t.Fatalf("status %+v", st)
	}
	f2, h2 := newHandFleet(t)
	base = parseBase(t, 0)
	go func() {
		var eps []Endpoint
		for i := range 100 {
			eps = append(eps, ep(fmt.Sprintf("10.0.1.%d", i), true))
		}
		(<-h2.sinks).Set(eps)
	}()
	if cfg, err = f2.Prepare(base); err != nil {
		t.Fatal(err)
	}
	if n := len(cfg.Routes[0].Targets); n != config.MaxTargets {
		t.Fatalf("%d targets", n)
	}
	// The fixed target takes one place: 63 of the 100 endpoints are live, the other 37 capped.
	if st := f2.Status(); st[0].States[StateLive] != config.MaxTargets-1 || st[0].States[StateCapped] != 100-(config.MaxTargets-1) {
		t.Fatalf("status %v", st[0].States)
	}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatal(errs)
	}
}

// TestFleetDecodePool: a disaggregated route's decode pool may name a source too; its endpoints become
// decode targets, and a decode pool that has found none yet is a valid config.
func TestFleetDecodePool(t *testing.T) {
	f, h := newHandFleet(t)
	base := parseBase(t, 0)
	rc := &base.Routes[0]
	w := 1.0
	rc.Disaggregation = &config.DisaggregationConfig{Protocol: config.ProtocolVLLM, PrefillThresholdTokens: new(int),
		Decode: []config.TargetConfig{{Source: "pool", Model: "llama", Weight: &w}}}
	rc.Targets = rc.Targets[:1] // the prefill pool: the fixed provider
	go func() { (<-h.sinks).Set(nil) }()
	cfg, err := f.Prepare(base)
	if err != nil {
		t.Fatal(err)
	}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatal(errs)
	}
	if d := cfg.Routes[0].Disaggregation; len(d.Decode) != 0 || len(d.DecodeDiscovered) != 1 || base.Routes[0].Disaggregation.Decode[0].Source != "pool" {
		t.Fatalf("decode pool %+v (the base must stay as it was)", d)
	}
	a := &applied{t: t}
	f.Attach(a.apply)
	f.applyMu.Lock()
	sink := f.sources["pool"]
	f.applyMu.Unlock()
	sink.Set([]Endpoint{ep("10.0.0.1", true), ep("10.0.0.2", true)})
	waitFor(t, "the decode endpoints", func() bool {
		if a.count() == 0 {
			return false
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		d := a.cfgs[len(a.cfgs)-1].Routes[0].Disaggregation
		return len(d.Decode) == 2 && d.Decode[0].Provider == "pool@10.0.0.1:8000"
	})
	if got := a.targets(); got != "fixed" {
		t.Fatalf("prefill pool %q, want the fixed provider alone", got)
	}
}
