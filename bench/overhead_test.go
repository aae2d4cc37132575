package bench

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// startUpstream serves NewFakeUpstream on loopback for a test.
func startUpstream(t *testing.T, cfg UpstreamConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: NewFakeUpstream(cfg), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// TestFakeUpstreamStream: the paced stream arrives whole, each delta no earlier than its send
// stamp, the whole stream no faster than its pace; instant answers are instant JSON.
func TestFakeUpstreamStream(t *testing.T) {
	const chunks, gap = 5, 15 * time.Millisecond
	addr := startUpstream(t, UpstreamConfig{Chunks: chunks, Gap: gap})
	r := &overheadRun{o: &OverheadOptions{ThroughputConcurrency: 2}, addrs: map[string]string{PathDirect: addr}, chunks: chunks,
		clients: map[string]*fasthttp.HostClient{PathDirect: {Addr: addr}}}
	start := time.Now()
	st, err := r.stream(context.Background(), PathDirect)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < chunks*gap {
		t.Fatalf("stream took %v, faster than its pace %v", took, chunks*gap)
	}
	if len(st.gaps) != chunks-1 || len(st.transit) != chunks {
		t.Fatalf("%d gaps, %d transits; want %d, %d", len(st.gaps), len(st.transit), chunks-1, chunks)
	}
	sum := 0.0
	for _, g := range st.gaps {
		sum += g
	}
	for _, tr := range st.transit {
		if tr < 0 {
			t.Fatalf("a delta arrived before it was sent: transit %v µs", tr)
		}
	}
	// The role chunk comes at once, before the paced deltas: its first byte is measured, and before the
	// stream ended. (Not against the pace itself: on a loaded machine the first byte can be late by more
	// than the gaps.)
	if st.ttfb <= 0 || st.ttfb >= float64(took.Microseconds()) {
		t.Fatalf("ttfb %v µs of a %v stream (gaps sum %v µs)", st.ttfb, took, sum)
	}

	l, err := r.latency(context.Background(), PathDirect, 20)
	if err != nil || len(l.samples) != 20 || l.errors != 0 {
		t.Fatalf("latency: %v, %d samples, %d errors", err, len(l.samples), l.errors)
	}
	tp := r.throughput(context.Background(), PathDirect, 2, 100*time.Millisecond)
	if tp.count == 0 || tp.errors != 0 {
		t.Fatalf("throughput: %+v", tp)
	}
}

func TestDeltaStamp(t *testing.T) {
	f := func(ev string, want int64, wantOK bool) {
		t.Helper()
		got, ok := deltaStamp([]byte(ev))
		if got != want || ok != wantOK {
			t.Fatalf("%q: got %d %v, want %d %v", ev, got, ok, want, wantOK)
		}
	}
	f(`data: {"choices":[{"delta":{"content":"1700000000123456789"}}]}`, 1700000000123456789, true)
	f(string(roleEvent), 0, false)
	f(string(finishEvent), 0, false)
	f(`data: {"choices":[{"delta":{"content":"abc"}}]}`, 0, false)
}

func TestRSSTrend(t *testing.T) {
	f := func(samples []float64, wantGrowth float64, wantFlat bool) {
		t.Helper()
		_, _, _, g, flat := rssTrend(samples)
		if g != wantGrowth || flat != wantFlat {
			t.Fatalf("%v: growth %v flat %v; want %v %v", samples, g, flat, wantGrowth, wantFlat)
		}
	}
	f([]float64{10, 20, 30, 30, 30, 30, 31, 30, 30}, 0, true)           // warm-up, then a plateau
	f([]float64{20, 20, 20, 30, 31, 32, 40, 42, 44}, 11, false)         // still growing
	f([]float64{100, 100, 100, 100, 100, 104, 104, 104, 104}, 4, true)  // 4 MiB < 5% of 100
	f([]float64{100, 100, 100, 100, 100, 100, 106, 106, 106}, 6, false) // 6 MiB > 5 MiB
	f([]float64{1, 2}, 0, false)
}

func TestReadRSS(t *testing.T) {
	rss, err := readRSS(os.Getpid())
	if err != nil {
		t.Skipf("no /proc: %s", err)
	}
	if rss < 1<<20 || rss > 1<<40 {
		t.Fatalf("RSS %d bytes is implausible", rss)
	}
	if _, err := readRSS(1 << 30); err == nil {
		t.Fatal("RSS of a pid that cannot exist")
	}
}

// TestProcStop: a child is started, its ready line read, and stopped by PID.
func TestProcStop(t *testing.T) {
	p, rest, err := startProc("sleeper", "/bin/sh", []string{"-c", "echo 'listening http://127.0.0.1:9'; exec sleep 30"}, "listening http://", 5*time.Second)
	if err != nil {
		t.Skipf("no /bin/sh: %s", err)
	}
	if rest != "127.0.0.1:9" {
		t.Fatalf("ready line rest %q", rest)
	}
	if !p.alive() {
		t.Fatal("child not alive")
	}
	start := time.Now()
	p.stop()
	if p.alive() {
		t.Fatal("child alive after stop")
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("stop took %v: SIGTERM ignored?", took)
	}
	p.stop() // idempotent

	_, _, err = startProc("quitter", "/bin/sh", []string{"-c", "echo boom >&2; exit 3"}, "listening", 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("got %v; want the child's output in the error", err)
	}
}

func TestOverheadSummaryAndGoals(t *testing.T) {
	round := func(d, r, h float64) map[string]*PathRound {
		mk := func(lat, tput float64, gapJit float64) *PathRound {
			return &PathRound{LatencyP50: lat, LatencyP99: 2 * lat, Throughput: tput, TTFB: lat,
				Gaps: []float64{20000, 20000 + gapJit}, Transit: []float64{100, 100 + gapJit}, Jitter: []float64{gapJit}}
		}
		return map[string]*PathRound{PathDirect: mk(d, 50000, 5), PathRolter: mk(r, 30000, 20), PathHAProxy: mk(h, 33000, 10)}
	}
	rep := &OverheadReport{Paths: []string{PathDirect, PathRolter, PathHAProxy}, Summary: map[string]*PathSummary{},
		Rounds: []map[string]*PathRound{round(30, 90, 80), round(30, 95, 85), round(40, 100, 1000)}}
	rep.Options.ThroughputConcurrency = 64
	summarizeOverhead(rep)
	ro, hp := rep.Summary[PathRolter], rep.Summary[PathHAProxy]
	// Added = median over rounds of (path - direct): rolter 60, 65, 60 -> 60; haproxy 50, 55, 960 -> 55.
	if ro.AddedP50 != 60 || hp.AddedP50 != 55 || ro.Throughput != 30000 || ro.AddedJitP99 != 15 {
		t.Fatalf("rolter %+v haproxy %+v", ro, hp)
	}
	rep.RSS = []*RSSRun{{Path: PathRolter, Flat: true}}
	goals := overheadGoals(rep)
	want := []string{"PASS", "PASS", "PASS", "PASS", "PASS"} // 60/55 = 1.09, 120/110, 30000/33000 = 0.91, +15 µs, flat
	if len(goals) != len(want) {
		t.Fatalf("%d goals: %+v", len(goals), goals)
	}
	for i, g := range goals {
		if g.Verdict != want[i] {
			t.Fatalf("goal %q: %s (%s), want %s", g.Name, g.Verdict, g.Measured, want[i])
		}
	}
	md := rep.Markdown()
	for _, s := range []string{"## Goals", "rolter ÷ haproxy", "1.09x"} {
		if !strings.Contains(md, s) {
			t.Fatalf("markdown lacks %q:\n%s", s, md)
		}
	}
	// Without HAProxy the ratio goals are n/a, not failures.
	delete(rep.Summary, PathHAProxy)
	for _, g := range overheadGoals(rep)[:3] {
		if g.Verdict != "n/a" {
			t.Fatalf("goal %q without HAProxy: %s", g.Name, g.Verdict)
		}
	}
}
