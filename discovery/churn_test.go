package discovery

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
)

// churnFleet is a fleet of sources × perSource endpoints, one route per source (cache_aware), with the
// gateway built on it: what BenchmarkChurn and TestChurnUnderLoad change one endpoint at a time.
type churnFleet struct {
	f     *Fleet
	g     *engine.Gateway
	sinks []*watched
	eps   [][]Endpoint
	next  int // the next fresh address
}

// churnConfig is the text of a config with n sources of kind dns, each the only target of route m<i>.
func churnConfig(n int, listen string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\n", listen)
	for i := range n {
		fmt.Fprintf(&b, "[[sources]]\nname = \"s%d\"\nkind = \"dns\"\nport = 1\nsettle_secs = 0\n[sources.dns]\nname = \"s%d.test\"\nrecord = \"a\"\n"+
			"[sources.provider]\napi_base = \"http://{ip}:{port}\"\n", i, i)
	}
	for i := range n {
		fmt.Fprintf(&b, "[[routes]]\nmodel = \"m%d\"\nstrategy = \"cache_aware\"\n[[routes.targets]]\nsource = \"s%d\"\n", i, i)
	}
	return b.String()
}

// newChurnFleet starts the fleet and the gateway; addr gives the address of endpoint k.
func newChurnFleet(tb testing.TB, sources, perSource int, listen string, addr func(k int) netip.AddrPort) *churnFleet {
	tb.Helper()
	base, err := config.Parse([]byte(churnConfig(sources, listen)), "churn.toml")
	if err != nil {
		tb.Fatal(err)
	}
	cf := &churnFleet{eps: make([][]Endpoint, sources)}
	for s := range sources {
		for range perSource {
			cf.eps[s] = append(cf.eps[s], Endpoint{Addr: addr(cf.next), Ready: true})
			cf.next++
		}
	}
	set := 0
	cf.f = New(Options{Logger: slog.New(slog.DiscardHandler), NewWatcher: func(sc *config.SourceConfig) (Watcher, error) {
		s := set
		set++
		return watchFunc(func(sink Sink) { sink.Set(append([]Endpoint(nil), cf.eps[s]...)) }), nil
	}})
	tb.Cleanup(cf.f.Close)
	cfg, err := cf.f.Prepare(base)
	if err != nil {
		tb.Fatal(err)
	}
	for s := range sources {
		cf.sinks = append(cf.sinks, cf.f.sources[fmt.Sprintf("s%d", s)])
	}
	if cf.g, err = engine.New(cfg, engine.Options{Logger: slog.New(slog.DiscardHandler)}); err != nil {
		tb.Fatal(err)
	}
	return cf
}

// watchFunc is a watcher that reports once and waits for the end.
type watchFunc func(sink Sink)

func (w watchFunc) Watch(ctx context.Context, sink Sink) {
	w(sink)
	<-ctx.Done()
}

// change replaces one endpoint of source s by a fresh one: one endpoint leaves, one joins.
func (cf *churnFleet) change(s int, addr func(k int) netip.AddrPort) {
	eps := cf.eps[s]
	eps[cf.next%len(eps)] = Endpoint{Addr: addr(cf.next), Ready: true}
	cf.next++
	cf.sinks[s].Set(append([]Endpoint(nil), eps...))
}

func benchAddr(k int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(k >> 16), byte(k >> 8), byte(k)}), 8000)
}

// BenchmarkChurn: one endpoint change in a fleet of 1,000 endpoints (20 routes of 50), from the
// source's report to the gateway serving the new config: the expansion, and the gateway's reload, which
// carries every other target over.
func BenchmarkChurn(b *testing.B) {
	cf := newChurnFleet(b, 20, 50, "127.0.0.1:0", benchAddr)
	defer cf.g.Shutdown(context.Background())
	b.Run("expand", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			cf.change(i%len(cf.sinks), benchAddr)
			_ = expand(cf.f.base, cf.f.sources, nil, time.Now())
		}
	})
	b.Run("expand+reload", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			cf.change(i%len(cf.sinks), benchAddr)
			x := expand(cf.f.base, cf.f.sources, nil, time.Now())
			if err := cf.g.Reload(x.cfg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestChurnUnderLoad: a fleet of 1,000 endpoints on loopback addresses, 100 endpoint changes a second
// for three seconds, while clients send requests to every route: no request fails, and the gateway ends
// on exactly the sources' sets, with traffic on the endpoints that joined.
func TestChurnUnderLoad(t *testing.T) {
	const sources, per, changesPerSec = 20, 50, 100
	var served sync.Map // address -> *atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if n, ok := served.Load(r.Host); ok {
			n.(*atomic.Int64).Add(1)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	port := 0
	var servers []*http.Server
	listen := func(k int) netip.AddrPort {
		// Endpoint k listens on 127.1.x.y, one listener each: 127.0.0.0/8 is loopback.
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 1, byte(k >> 8), byte(k)}), uint16(port))
		ln, err := net.Listen("tcp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		if port == 0 {
			port = ln.Addr().(*net.TCPAddr).Port
			a = netip.AddrPortFrom(a.Addr(), uint16(port))
		}
		served.Store(a.String(), new(atomic.Int64))
		srv := &http.Server{Handler: handler}
		servers = append(servers, srv)
		go srv.Serve(ln)
		return a
	}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	cf := newChurnFleet(t, sources, per, "127.0.0.1:0", listen)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go cf.g.Serve(ln)
	defer cf.g.Shutdown(context.Background())
	cf.f.Attach(cf.g.Reload)
	url := "http://" + ln.Addr().String() + "/v1/chat/completions"

	stop := make(chan struct{})
	var sent, failed atomic.Int64
	var wg sync.WaitGroup
	for c := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Each prompt opens differently, so the route's rendezvous homes spread them over its targets.
				body := fmt.Sprintf(`{"model":"m%d","messages":[{"role":"user","content":"%x: a question from client %d"}]}`, (c+i)%sources, uint32(i*2654435761+c), c)
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("request: %v", err)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					t.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}
		}()
	}
	// The endpoints that will join listen before the clock starts.
	firstNew := cf.next
	spare := map[int]netip.AddrPort{}
	for k := firstNew; k < firstNew+4*changesPerSec; k++ {
		spare[k] = listen(k)
	}
	// Ten changes every 100 ms, each to another source.
	tick := time.NewTicker(100 * time.Millisecond)
	changes := 0
	start := time.Now()
	for changes < 3*changesPerSec {
		<-tick.C
		for range changesPerSec / 10 {
			cf.change(changes%sources, func(k int) netip.AddrPort { return spare[k] })
			changes++
		}
	}
	rate := float64(changes) / time.Since(start).Seconds()
	tick.Stop()
	// Requests keep going while the last changes are applied.
	waitFor(t, "the last change to be applied", func() bool {
		st := cf.f.Status()
		f := cf.f
		f.applyMu.Lock()
		defer f.applyMu.Unlock()
		x := expand(f.base, f.sources, f.policy, time.Now())
		return x.key == f.applied && len(st) == sources && x.next.IsZero()
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	live := cf.g.State()
	var onNew int64
	for k := firstNew; k < cf.next; k++ {
		a := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 1, byte(k >> 8), byte(k)}), uint16(port)).String()
		if n, ok := served.Load(a); ok {
			onNew += n.(*atomic.Int64).Load()
		}
	}
	targets := 0
	for _, r := range live.Routes {
		targets += len(r.Targets)
	}
	t.Logf("%d requests, %d failed, %d endpoint changes (%.0f a second), %d requests on endpoints that joined, %d targets at the end",
		sent.Load(), failed.Load(), changes, rate, onNew, targets)
	if failed.Load() > 0 || sent.Load() == 0 {
		t.Fatalf("%d of %d requests failed", failed.Load(), sent.Load())
	}
	if targets != sources*per || onNew == 0 {
		t.Fatalf("%d targets at the end (want %d), %d requests on joined endpoints", targets, sources*per, onNew)
	}
}
