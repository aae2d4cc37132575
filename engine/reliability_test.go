package engine

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

func quietHealth(cfg *config.Config) *providerHealth {
	return newProviderHealth("t", cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
}

// TestBreakerTransitions pins closed -> open -> half-open -> closed, and half-open -> open on a failed probe.
func TestBreakerTransitions(t *testing.T) {
	cfg := config.Default()
	cfg.Cooldown.Enabled = false
	cfg.Breaker = config.BreakerConfig{Enabled: true, Failures: 3, OpenSecs: 10, HalfOpenProbes: 1}
	h := quietHealth(cfg)
	now := time.Now().UnixNano()
	state := func(want int32) {
		t.Helper()
		if got := h.brState.Load(); got != want {
			t.Fatalf("breaker %s, want %s", breakerNames[got], breakerNames[want])
		}
	}
	for i := 0; i < 2; i++ {
		h.failure(now, false, failReset, 0)
	}
	state(breakerClosed)
	if !h.eligible(now) {
		t.Fatal("closed breaker must be eligible")
	}
	h.failure(now, false, failStatus, 0)
	state(breakerOpen)
	if h.eligible(now) {
		t.Fatal("open breaker must not be eligible")
	}
	if ok, _ := h.admit(now); ok {
		t.Fatal("open breaker admitted a request")
	}
	later := now + int64(11*time.Second)
	if !h.eligible(later) {
		t.Fatal("after open_secs the breaker must let a probe through")
	}
	ok, probe := h.admit(later)
	if !ok || !probe {
		t.Fatalf("admit = %v, %v; want a probe", ok, probe)
	}
	state(breakerHalfOpen)
	if h.eligible(later) {
		t.Fatal("half-open with its probe in flight must not take more requests")
	}
	if ok, _ := h.admit(later); ok {
		t.Fatal("a second probe was admitted")
	}
	h.failure(later, true, failReset, 0)
	state(breakerOpen)
	evenLater := later + int64(11*time.Second)
	ok, probe = h.admit(evenLater)
	if !ok || !probe {
		t.Fatal("no probe after the second open period")
	}
	h.success(true)
	state(breakerClosed)
	if !h.eligible(evenLater) || h.brProbes.Load() != 0 {
		t.Fatal("closed breaker must be eligible with no probes outstanding")
	}
}

// TestCooldownEscalates pins the cooldown rules: threshold within a window, doubling while it keeps
// failing, reset on success, and 429 retry-after.
func TestCooldownEscalates(t *testing.T) {
	cfg := config.Default()
	cfg.Breaker.Enabled = false
	cfg.Cooldown = config.CooldownConfig{Enabled: true, Failures: 3, WindowSecs: 10, BaseSecs: 1, MaxSecs: 3, MaxRetryAfterSecs: 5}
	h := quietHealth(cfg)
	now := time.Now().UnixNano()
	cooling := func(at int64, want bool) {
		t.Helper()
		if got := !h.eligible(at); got != want {
			t.Fatalf("cooling at +%s = %v, want %v", time.Duration(at-now), got, want)
		}
	}
	sec := int64(time.Second)
	// Failures spread wider than the window never trip it.
	h.failure(now, false, failReset, 0)
	h.failure(now+11*sec, false, failReset, 0)
	h.failure(now+22*sec, false, failReset, 0)
	cooling(now+22*sec, false)
	now += 22 * sec
	h.failure(now, false, failReset, 0)
	h.failure(now, false, failReset, 0)
	cooling(now, true) // 3 within the window: 1 s
	cooling(now+sec+1, false)
	// Failing again after the cooldown ended, before any success: 2 s, then capped at 3 s.
	now += sec + 1
	h.failure(now, false, failStatus, 0)
	cooling(now+2*sec-1, true)
	cooling(now+2*sec+1, false)
	now += 2*sec + 1
	h.failure(now, false, failStatus, 0)
	cooling(now+3*sec-1, true)
	cooling(now+3*sec+1, false)
	// A success resets the escalation.
	h.success(false)
	now += 3*sec + 1
	h.failure(now, false, failStatus, 0)
	cooling(now, false)
	// 429 with retry-after cools for that long, capped.
	h.failure(now, false, failStatus, 2*time.Second)
	cooling(now+2*sec-1, true)
	cooling(now+2*sec+1, false)
	h.failure(now, false, failStatus, time.Hour)
	cooling(now+5*sec-1, true)
	cooling(now+5*sec+1, false)
}

// flaky is a fake upstream whose failure mode can be switched at runtime.
type flaky struct {
	mode atomic.Int32 // 0 ok, 1 HTTP 500, 2 hang before headers
	hits atomic.Int64
}

func (f *flaky) handler(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	switch f.mode.Load() {
	case 1: // down: what a proxy in front of a dead engine, or an engine still loading, answers
		w.WriteHeader(503)
		io.WriteString(w, `{"error":{"message":"boom","type":"ServiceUnavailableError","param":null,"code":503}}`)
	case 3: // up, but failing every request it is given
		w.WriteHeader(500)
		io.WriteString(w, `{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`)
	case 2:
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	default:
		okJSON(w, r)
	}
}

// TestFailingReplicaLeavesAndReturns: a replica that starts failing stops getting traffic within the
// threshold, and gets it again only after it recovers (health checks see it healthy, cooldown over).
func TestFailingReplicaLeavesAndReturns(t *testing.T) {
	var bad, good flaky
	ub := newFakeUpstream(t, bad.handler)
	ug := newFakeUpstream(t, good.handler)
	// /health follows the failure mode.
	ub.setHandler(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			if bad.mode.Load() != 0 {
				w.WriteHeader(503)
			}
			return
		}
		bad.handler(w, r)
	})
	ug.setHandler(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		good.handler(w, r)
	})
	extra := `
[retry]
backoff_ms = 1
[cooldown]
failures = 2
base_secs = 0.3
max_secs = 0.3
[breaker]
enabled = false
[health]
enabled = true
interval_secs = 0.05
timeout_secs = 0.5
unhealthy_threshold = 2
healthy_threshold = 2
`
	gw := startGateway(t, gatewayConfig("round_robin", extra, ub.URL, ug.URL))
	send := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
				t.Fatalf("client saw status %d: %s", resp.StatusCode, got)
			}
		}
	}
	send(10)
	if bad.hits.Load() == 0 {
		t.Fatal("round robin never used the first replica")
	}
	bad.mode.Store(1)
	before := bad.hits.Load()
	send(20)
	if n := bad.hits.Load() - before; n > 2 {
		t.Fatalf("failing replica got %d requests, want at most the cooldown threshold (2)", n)
	}
	// Still failing past its cooldown: health checks keep it out.
	time.Sleep(500 * time.Millisecond)
	before = bad.hits.Load()
	send(20)
	if n := bad.hits.Load() - before; n != 0 {
		t.Fatalf("unhealthy replica got %d requests", n)
	}
	// Recovery: it comes back.
	bad.mode.Store(0)
	waitFor(t, 3*time.Second, "the replica to be healthy again", func() bool {
		return gw.g.Snapshot().Providers[0].health.eligible(time.Now().UnixNano())
	})
	before = bad.hits.Load()
	send(20)
	if n := bad.hits.Load() - before; n < 5 {
		t.Fatalf("recovered replica got only %d of 20 requests", n)
	}
}

// TestHungReplica: a replica that hangs before headers costs its clients at most timeouts.headers_secs,
// and once it cools down nobody waits on it.
func TestHungReplica(t *testing.T) {
	var hung, good flaky
	hung.mode.Store(2)
	uh := newFakeUpstream(t, hung.handler)
	ug := newFakeUpstream(t, good.handler)
	gw := startGateway(t, gatewayConfig("round_robin", "[timeouts]\nheaders_secs = 0.3\n[cooldown]\nfailures = 1\nbase_secs = 30\n", uh.URL, ug.URL))
	start := time.Now()
	resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if d := time.Since(start); resp.StatusCode != 504 || d > 2*time.Second {
		t.Fatalf("status %d after %s", resp.StatusCode, d)
	}
	start = time.Now()
	for i := 0; i < 10; i++ {
		if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("10 requests took %s: clients still wait on the hung replica", d)
	}
	if hung.hits.Load() != 1 {
		t.Fatalf("the hung replica got %d requests", hung.hits.Load())
	}
}

// TestOneOfThreeDown: while one of three replicas fails, 2,000 requests at concurrency 64 see no error.
func TestOneOfThreeDown(t *testing.T) {
	ups := make([]*flaky, 3)
	urls := make([]string, 3)
	for i := range ups {
		ups[i] = &flaky{}
		urls[i] = newFakeUpstream(t, ups[i].handler).URL
	}
	gw := startGateway(t, gatewayConfig("least_load", "[retry]\nbackoff_ms = 1\n", urls...))
	var errs, done atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 64; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				req, _ := http.NewRequest("POST", gw.URL+"/v1/chat/completions", strings.NewReader(chatBody("m", fmt.Sprint(i), false)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := testClient.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	for i := 0; i < 2000; i++ {
		if i == 300 {
			ups[1].mode.Store(1) // replica 1 goes down mid-run
		}
		work <- i
	}
	close(work)
	wg.Wait()
	if errs.Load() != 0 || done.Load() != 2000 {
		t.Fatalf("%d client-visible errors, %d done", errs.Load(), done.Load())
	}
	if h := ups[1].hits.Load(); h > 400 {
		t.Fatalf("the failed replica kept getting traffic: %d hits", h)
	}
}

// TestQueueFull: with a per-target cap and a full wait queue the answer is 429 at once, with retry-after.
func TestQueueFull(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		okJSON(w, r)
	})
	defer close(release)
	gw := startGateway(t, gatewayConfig("round_robin", "[queue]\nmax_inflight_per_target = 2\nmax_waiting_per_target = 1\nwait_timeout_secs = 5\n", up.URL))
	for i := 0; i < 3; i++ { // 2 in flight, 1 waiting
		go fire(gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	p := gw.g.Snapshot().Providers[0]
	waitFor(t, 2*time.Second, "2 in flight and 1 waiting", func() bool { return p.Inflight() == 2 && p.adm.waiting.Load() == 1 })
	start := time.Now()
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if d := time.Since(start); resp.StatusCode != 429 || d > time.Second {
		t.Fatalf("status %d after %s: %s", resp.StatusCode, d, got)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Fatalf("429 without retry-after")
	}
	assertOpenAIError(t, got, "queue_full")
}

// TestGlobalCap: [queue] max_inflight bounds the whole gateway.
func TestGlobalCap(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		okJSON(w, r)
	})
	defer close(release)
	gw := startGateway(t, gatewayConfig("round_robin", "[queue]\nmax_inflight = 2\n", up.URL))
	for i := 0; i < 2; i++ {
		go fire(gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	waitFor(t, 2*time.Second, "2 in flight", func() bool { return gw.g.inflight.Load() == 2 })
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "too_many_requests")
}

// TestFailOpenAndReject: with every target ineligible the request goes to the least-bad one, or is
// answered 503 when health.fail_open = false.
func TestFailOpenAndReject(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	h := gw.g.Snapshot().Providers[0].health
	h.coolUntil.Store(time.Now().Add(time.Hour).UnixNano())
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Decision") != "fallback" {
		t.Fatalf("status %d decision %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Decision"), got)
	}

	// Also through an open breaker.
	h.coolUntil.Store(0)
	h.brState.Store(breakerOpen)
	h.brUntil.Store(time.Now().Add(time.Hour).UnixNano())
	resp, got = post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Decision") != "fallback" {
		t.Fatalf("open breaker: status %d decision %q: %s", resp.StatusCode, resp.Header.Get("X-Rolter-Decision"), got)
	}

	gw2 := startGateway(t, gatewayConfig("round_robin", "[health]\nfail_open = false\n", up.URL))
	gw2.g.Snapshot().Providers[0].health.down.Store(true)
	resp, got = post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 503 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "no_available_target")
}

// TestIneligibleNotCompared: an unhealthy idle replica does not attract least_load traffic.
func TestIneligibleNotCompared(t *testing.T) {
	var a, b flaky
	ua, ub := newFakeUpstream(t, a.handler), newFakeUpstream(t, b.handler)
	gw := startGateway(t, gatewayConfig("least_load", "", ua.URL, ub.URL))
	gw.g.Snapshot().Providers[0].health.down.Store(true)
	for i := 0; i < 20; i++ {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	if a.hits.Load() != 0 || b.hits.Load() != 20 {
		t.Fatalf("hits a=%d b=%d", a.hits.Load(), b.hits.Load())
	}
}

// TestNoRetryOnClientErrors: a 400 from the upstream is the client's error, passed on and not retried.
func TestNoRetryOnClientErrors(t *testing.T) {
	var hits atomic.Int64
	h := func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(400)
		io.WriteString(w, `{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}`)
	}
	gw := startGateway(t, gatewayConfig("round_robin", "", newFakeUpstream(t, h).URL, newFakeUpstream(t, h).URL))
	resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 400 || hits.Load() != 1 {
		t.Fatalf("status %d hits %d", resp.StatusCode, hits.Load())
	}
}
