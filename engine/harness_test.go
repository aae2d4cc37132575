package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/freeport"
)

// fakeUpstream is an OpenAI-compatible upstream on loopback built on net/http, whose request context is
// cancelled when the gateway closes the connection - which is how tests see a disconnect propagate.
type fakeUpstream struct {
	t        *testing.T
	ln       net.Listener
	srv      *http.Server
	URL      string
	handler  atomic.Pointer[http.HandlerFunc]
	requests atomic.Int64
	// gone receives the time a request's connection was closed by the gateway before the handler finished.
	gone chan time.Time

	mu       sync.Mutex
	lastBody string
	lastHdr  http.Header
}

func newFakeUpstream(t *testing.T, h http.HandlerFunc) *fakeUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &fakeUpstream{t: t, ln: ln, URL: "http://" + ln.Addr().String(), gone: make(chan time.Time, 64)}
	u.setHandler(h)
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve), ErrorLog: nil}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

func (u *fakeUpstream) setHandler(h http.HandlerFunc) { u.handler.Store(&h) }

func (u *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.lastBody = string(body)
	u.lastHdr = r.Header.Clone()
	u.mu.Unlock()
	r.Body = io.NopCloser(strings.NewReader(string(body)))
	(*u.handler.Load())(w, r)
	if r.Context().Err() != nil {
		select {
		case u.gone <- time.Now():
		default:
		}
	}
}

func (u *fakeUpstream) last() (string, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lastBody, u.lastHdr
}

// okJSON answers a chat completion naming the model it was asked for.
func okJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
}

// sseEvents streams n chat chunks every gap, then [DONE]. It stops when the client goes away.
func sseEvents(n int, gap time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := 0; i < n; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(gap):
			}
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}
}

// testGateway is a gateway serving on loopback.
type testGateway struct {
	g    *Gateway
	URL  string
	addr string
}

func startGateway(t *testing.T, cfgText string) *testGateway {
	t.Helper()
	return startGatewayWith(t, cfgText, Options{})
}

// startGatewayWith starts a gateway with opts (logger, version and watch delay are the harness's).
func startGatewayWith(t *testing.T, cfgText string, opts Options) *testGateway {
	t.Helper()
	cfg, err := config.Parse([]byte(cfgText), "test.toml")
	if err != nil {
		t.Fatalf("bad test config: %s\n%s", err, cfgText)
	}
	return startGatewayConfig(t, cfg, opts)
}

// startGatewayConfig starts a gateway on a config already parsed (and changed by the test).
func startGatewayConfig(t *testing.T, cfg *config.Config, opts Options) *testGateway {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if opts.Logger == nil {
		opts.Logger = log
	}
	opts.Version, opts.WatchDelay = "test", 20*time.Millisecond
	g, err := New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Idle fasthttp workers linger 10 s by default; leak checks want them gone sooner.
	g.server.MaxIdleWorkerDuration = 200 * time.Millisecond
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := g.Serve(ln); err != nil {
			t.Errorf("serve: %s", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
		<-done
	})
	return &testGateway{g: g, URL: "http://" + ln.Addr().String(), addr: ln.Addr().String()}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// gatewayConfig renders a config with one route "m" over the given upstream URLs.
func gatewayConfig(strategy string, extra string, urls ...string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, u := range urls {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = %q\n", i, u)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = \"m\"\nstrategy = %q\n", strategy)
	for i := range urls {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\nmodel = \"up-model\"\n", i)
	}
	b.WriteString(extra)
	return b.String()
}

var testClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}, Timeout: 30 * time.Second}

func post(t *testing.T, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %s", url, err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("reading body: %s", err)
	}
	return resp, string(b)
}

// rawRequest sends a raw HTTP request on a fresh connection and returns the connection and a reader.
func rawRequest(t *testing.T, addr, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

// deadAddr is a loopback address nothing listens on: connecting to it is refused. It is below the ephemeral
// range (freeport.Loopback), so another test's server or connection does not take it meanwhile.
func deadAddr(t *testing.T) string {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

func chatBody(model, text string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":%q}]}`, model, stream, text)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func contextDone() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// fire sends a request from a background goroutine and ignores the outcome.
func fire(url, body string) {
	resp, err := testClient.Post(url, "application/json", strings.NewReader(body))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// readAndPrepare runs the request path up to the pick on a call: body read, parse, route, rank.
// Memory the call held for the previous run is given back first, as release would.
func readAndPrepare(c *call, ctx *fasthttp.RequestCtx) *apiError {
	// The request's start, as post sets it: the zero time is before any cooldown's end, which would make
	// every target ineligible and measure the fail-open path instead of the strategy.
	c.start = time.Now()
	c.g.bodyMem.Add(-c.held)
	c.held = 0
	c.hdr = reqHeaders{}
	if e := checkRequest(ctx, &c.hdr); e != nil {
		return e
	}
	if e := c.readBody(ctx); e != nil {
		return e
	}
	return c.prepare(ctx)
}

// testSnapshot builds the snapshot of cfg as a gateway would, without serving it or starting anything.
func testSnapshot(tb testing.TB, cfg *config.Config) *Snapshot {
	tb.Helper()
	g := &Gateway{log: quietLog(), series: map[string]*series{}}
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	s, err := g.buildSnapshot(cfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
