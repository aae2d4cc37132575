package telemetry

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// startServer serves h on 127.0.0.1 until the test ends and returns its base URL.
func startServer(t *testing.T, h fasthttp.RequestHandler) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot listen: %s", err)
	}
	srv := &fasthttp.Server{Handler: h, Logger: &fasthttpSilent{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
		<-done
	})
	return "http://" + ln.Addr().String()
}

type fasthttpSilent struct{}

func (*fasthttpSilent) Printf(string, ...any) {}

// waitFor polls cond until it holds or 10 s pass; it bounds tests without timing assertions.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestScrapeConfigURL(t *testing.T) {
	f := func(base, path, want string) {
		t.Helper()
		c := ScrapeConfig{BaseURL: base, Path: path}
		got, err := c.URL()
		if err != nil || got != want {
			t.Fatalf("URL(%q, %q) = %q, %v; want %q", base, path, got, err, want)
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Validate(%q, %q): %s", base, path, err)
		}
	}
	f("http://127.0.0.1:8000", "", "http://127.0.0.1:8000/metrics")
	f("http://127.0.0.1:8000/", "", "http://127.0.0.1:8000/metrics")
	f("https://vllm.internal/engine-1/", "/metrics", "https://vllm.internal/engine-1/metrics")
	f("http://[::1]:9000", "/stats/prom", "http://[::1]:9000/stats/prom")

	bad := func(c ScrapeConfig, want ...string) {
		t.Helper()
		err := c.Validate()
		if err == nil {
			t.Fatalf("Validate(%+v) = nil; want an error", c)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Validate(%+v) = %q; want it to mention %q", c, err, w)
			}
		}
	}
	bad(ScrapeConfig{BaseURL: ""}, "scheme")
	bad(ScrapeConfig{BaseURL: "tcp://h:1"}, "scheme")
	bad(ScrapeConfig{BaseURL: "http://"}, "missing host")
	bad(ScrapeConfig{BaseURL: "http://u:p@h:1"}, "credentials")
	bad(ScrapeConfig{BaseURL: "http://h:1?x=1"}, "query")
	bad(ScrapeConfig{BaseURL: "http://h:1", Path: "metrics"}, "start with '/'")
	bad(ScrapeConfig{BaseURL: "http://h:1", Interval: -time.Second, Timeout: -1, MaxBodySize: -1},
		"interval -1s", "timeout -1ns", "max body size -1") // all errors at once
}

// metricsServer serves the vLLM fixture, or fails or hangs on demand.
type metricsServer struct {
	body    atomic.Pointer[[]byte]
	status  atomic.Int64
	hang    atomic.Bool
	hits    atomic.Int64
	entered chan struct{} // gets a value each time a hanging request arrives
	release chan struct{}

	mu       sync.Mutex
	lastPath string
	lastAuth string
}

func newMetricsServer(t *testing.T, body []byte) (*metricsServer, string) {
	ms := &metricsServer{entered: make(chan struct{}, 16), release: make(chan struct{})}
	ms.body.Store(&body)
	ms.status.Store(200)
	base := startServer(t, ms.handle)
	t.Cleanup(func() { close(ms.release) }) // runs before the server shuts down
	return ms, base
}

func (ms *metricsServer) handle(ctx *fasthttp.RequestCtx) {
	ms.hits.Add(1)
	ms.mu.Lock()
	ms.lastPath = string(ctx.Path())
	ms.lastAuth = string(ctx.Request.Header.Peek("Authorization"))
	ms.mu.Unlock()
	if ms.hang.Load() {
		ms.entered <- struct{}{}
		<-ms.release
		return
	}
	ctx.SetStatusCode(int(ms.status.Load()))
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	ctx.SetBody(*ms.body.Load())
}

func TestScraperValuesAndFailures(t *testing.T) {
	ms, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	var load EngineLoad
	s := NewScraper(ScrapeConfig{
		BaseURL: base + "/engine-0/",
		Timeout: 5 * time.Second,
		Headers: map[string]string{"Authorization": "Bearer secret"},
	}, &load, discardLogger)
	defer s.Stop()
	maxAge := int64(time.Minute)

	s.p.pollOnce()
	r, w, ok := load.Queue(time.Now().UnixNano(), maxAge)
	if !ok || r != 12 || w != 3 {
		t.Fatalf("Queue = %d, %d, %v; want 12, 3, true (stats %+v)", r, w, ok, s.Stats())
	}
	if u, ok := load.KVUsage(time.Now().UnixNano(), maxAge); !ok || math.Abs(u-0.34105) > 1e-9 {
		t.Fatalf("KVUsage = %v, %v; want 0.34105", u, ok)
	}
	ms.mu.Lock()
	path, auth := ms.lastPath, ms.lastAuth
	ms.mu.Unlock()
	if path != "/engine-0/metrics" || auth != "Bearer secret" {
		t.Fatalf("server saw path %q auth %q; want /engine-0/metrics and the configured header", path, auth)
	}
	// Staleness: the same successful scrape is not ok once older than maxAge.
	if _, _, ok := load.Queue(time.Now().UnixNano()+maxAge, maxAge); ok {
		t.Fatalf("a scrape older than maxAge is still ok")
	}

	// The server starts failing: the load is dropped at once, not kept stale.
	ms.status.Store(500)
	s.p.pollOnce()
	if _, _, ok := load.Queue(time.Now().UnixNano(), maxAge); ok {
		t.Fatalf("Queue still ok after a failed scrape")
	}
	st := s.Stats()
	if st.OK != 1 || st.Failed != 1 || st.LastError == nil || !strings.Contains(st.LastError.Error(), "status code 500") {
		t.Fatalf("Stats = %+v; want 1 ok, 1 failed with status 500", st)
	}

	// A 200 body without load series is a failure too.
	html := []byte("<html>\n<body>hello</body>\n</html>\n")
	ms.body.Store(&html)
	ms.status.Store(200)
	s.p.pollOnce()
	if _, _, ok := load.Queue(time.Now().UnixNano(), maxAge); ok || s.Stats().Failed != 2 {
		t.Fatalf("Queue ok after a body without load series (stats %+v)", s.Stats())
	}

	// Recovery with SGLang output.
	sg := readFixture(t, "sglang_metrics.txt")
	ms.body.Store(&sg)
	s.p.pollOnce()
	if r, w, ok := load.Queue(time.Now().UnixNano(), maxAge); !ok || r != 20 || w != 6 {
		t.Fatalf("Queue = %d, %d, %v after recovery; want 20, 6, true", r, w, ok)
	}
	if st := s.Stats(); st.OK != 2 || st.Failed != 2 || st.LastError == nil {
		t.Fatalf("Stats = %+v; want 2 ok, 2 failed and the last error kept", st)
	}
}

func TestScraperStartStop(t *testing.T) {
	ms, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	var load EngineLoad
	s := NewScraper(ScrapeConfig{BaseURL: base, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second}, &load, discardLogger)
	s.Stop() // before Start: no effect
	s = NewScraper(ScrapeConfig{BaseURL: base, Interval: 10 * time.Millisecond, Timeout: 5 * time.Second}, &load, discardLogger)
	s.Start()
	s.Start() // idempotent

	// Readers run concurrently with the poll goroutine (for -race).
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				load.Queue(time.Now().UnixNano(), int64(time.Minute))
				_ = s.Stats()
			}
		})
	}
	waitFor(t, "three scrapes", func() bool { return s.Stats().OK >= 3 })
	close(stop)
	readers.Wait()
	s.Stop()
	s.Stop() // idempotent
	// A scrape aborted by Stop may still reach the server's handler just after: count from a moment later.
	time.Sleep(30 * time.Millisecond)
	hits := ms.hits.Load()
	s.Start() // a stopped Scraper does not run again
	time.Sleep(50 * time.Millisecond)
	if ms.hits.Load() != hits {
		t.Fatalf("scrapes continued after Stop: %d -> %d", hits, ms.hits.Load())
	}
	if _, _, ok := load.Queue(time.Now().UnixNano(), int64(time.Minute)); !ok {
		t.Fatalf("Stop dropped the last good values; the owner decides via maxAge")
	}
}

func TestScraperTimeout(t *testing.T) {
	ms, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	var load EngineLoad
	s := NewScraper(ScrapeConfig{BaseURL: base, Timeout: 200 * time.Millisecond}, &load, discardLogger)
	defer s.Stop()
	s.p.pollOnce()
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); !ok {
		t.Fatalf("first scrape failed: %+v", s.Stats())
	}
	ms.hang.Store(true)
	s.p.pollOnce() // returns after Timeout although the server never answers
	st := s.Stats()
	if st.Failed != 1 || st.LastError == nil || !errors.Is(st.LastError, fasthttp.ErrTimeout) {
		t.Fatalf("Stats = %+v; want one failure with a timeout", st)
	}
	if st.LastDuration < 200*time.Millisecond {
		t.Fatalf("LastDuration = %s; the scrape cannot have waited for its timeout", st.LastDuration)
	}
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); ok {
		t.Fatalf("Queue still ok after a timed-out scrape")
	}
}

func TestScraperStopDoesNotWaitForHangingServer(t *testing.T) {
	ms, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	ms.hang.Store(true)
	var load EngineLoad
	const timeout = 20 * time.Second
	s := NewScraper(ScrapeConfig{BaseURL: base, Interval: time.Hour, Timeout: timeout}, &load, discardLogger)
	s.Start()
	select {
	case <-ms.entered:
	case <-time.After(10 * time.Second):
		t.Fatalf("the scrape never reached the server")
	}
	start := time.Now()
	s.Stop()
	// Without aborting the request Stop would take the whole timeout; a margin of half of it keeps
	// this check meaningful on a slow machine.
	if d := time.Since(start); d > timeout/2 {
		t.Fatalf("Stop took %s with a scrape hanging; want it to abort the scrape", d)
	}
	if st := s.Stats(); st.OK != 0 || st.Failed != 0 {
		t.Fatalf("Stats = %+v; a scrape aborted by Stop says nothing about the engine", st)
	}
}

// TestScraperDialsEveryScrape: with a Dial hook (the egress policy) every scrape dials anew - a refusal
// fails that scrape without touching the server, and the next allowed one reconnects.
func TestScraperDialsEveryScrape(t *testing.T) {
	ms, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	var load EngineLoad
	errDenied := errors.New("denied by policy")
	var deny atomic.Bool
	var dials atomic.Int64
	s := NewScraper(ScrapeConfig{BaseURL: base, Timeout: 5 * time.Second, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		if deny.Load() {
			return nil, errDenied
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}, &load, discardLogger)
	defer s.Stop()

	s.p.pollOnce()
	s.p.pollOnce()
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); !ok || dials.Load() != 2 {
		t.Fatalf("allowed scrapes: ok=%v after %d dials, want 2 (one per scrape)", ok, dials.Load())
	}
	deny.Store(true)
	hits := ms.hits.Load()
	s.p.pollOnce()
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); ok {
		t.Fatalf("Queue ok after a denied scrape")
	}
	if st := s.Stats(); st.Failed != 1 || !errors.Is(st.LastError, errDenied) {
		t.Fatalf("Stats = %+v; want the policy error", st)
	}
	if ms.hits.Load() != hits {
		t.Fatalf("a denied scrape reached the server")
	}
}

func TestScraperBodyTooLarge(t *testing.T) {
	_, base := newMetricsServer(t, readFixture(t, "vllm_metrics.txt"))
	var load EngineLoad
	s := NewScraper(ScrapeConfig{BaseURL: base, Timeout: 5 * time.Second, MaxBodySize: 4096}, &load, discardLogger)
	defer s.Stop()
	s.p.pollOnce()
	if st := s.Stats(); st.Failed != 1 || !errors.Is(st.LastError, fasthttp.ErrBodyTooLarge) {
		t.Fatalf("Stats = %+v; want a body-too-large failure", st)
	}
}

func TestScraperUnreachableAndInvalid(t *testing.T) {
	// A port nothing listens on: take one and close it.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot listen: %s", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()

	var load EngineLoad
	load.Store(1, 1, 0.1, time.Now().UnixNano())
	s := NewScraper(ScrapeConfig{BaseURL: "http://" + addr, Timeout: 5 * time.Second}, &load, discardLogger)
	s.p.pollOnce()
	s.Stop()
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); ok || s.Stats().Failed != 1 {
		t.Fatalf("connection refused left the load valid (stats %+v)", s.Stats())
	}

	load.Store(1, 1, 0.1, time.Now().UnixNano())
	s = NewScraper(ScrapeConfig{BaseURL: "ftp://nowhere"}, &load, nil)
	s.p.pollOnce()
	s.Stop()
	if st := s.Stats(); st.Failed != 1 || st.LastError == nil || !strings.Contains(st.LastError.Error(), "scheme") {
		t.Fatalf("invalid config: Stats = %+v; want the validation error", st)
	}
	if _, _, ok := load.Queue(time.Now().UnixNano(), 0); ok {
		t.Fatalf("invalid config left the load valid")
	}
}

func TestScraperAdapters(t *testing.T) {
	withLoRA := append(readFixture(t, "vllm_metrics.txt"), vllmLoRASeries...)
	ms, base := newMetricsServer(t, withLoRA)
	var load EngineLoad
	var a Adapters
	s := NewScraper(ScrapeConfig{BaseURL: base, Timeout: 5 * time.Second, Adapters: &a}, &load, discardLogger)
	defer s.Stop()
	maxAge := int64(time.Minute)

	s.p.pollOnce()
	v := a.View(time.Now().UnixNano(), maxAge)
	if !v.BatchKnown || v.MaxLoRA != 4 || !slices.Equal(v.Running, []string{"chat-lora", "sql-lora"}) || !slices.Equal(v.Waiting, []string{"tool-lora"}) {
		t.Fatalf("View = %+v after a scrape with LoRA series (stats %+v)", v, s.Stats())
	}

	// A body without the series: the scrape succeeds, the batch is known to be absent.
	plain := readFixture(t, "vllm_metrics.txt")
	ms.body.Store(&plain)
	s.p.pollOnce()
	if v := a.View(time.Now().UnixNano(), maxAge); v.BatchKnown || v.Running != nil || s.Stats().Failed != 0 {
		t.Fatalf("View = %+v after a body without LoRA series; want an unknown batch (stats %+v)", v, s.Stats())
	}

	// Back with the series, then a failed scrape invalidates it.
	ms.body.Store(&withLoRA)
	s.p.pollOnce()
	if !a.Running("sql-lora", time.Now().UnixNano(), maxAge) {
		t.Fatalf("sql-lora not running after the series came back")
	}
	ms.status.Store(500)
	s.p.pollOnce()
	if a.Running("sql-lora", time.Now().UnixNano(), maxAge) || a.View(time.Now().UnixNano(), maxAge).BatchKnown {
		t.Fatalf("batch kept after a failed scrape")
	}
}
