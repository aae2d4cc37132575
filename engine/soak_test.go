package engine

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestSoak drives the gateway at high concurrency with a mix of streamed and plain requests while clients
// disconnect at random (mid-stream, while waiting for headers, and after reading a little), then checks that
// goroutines return to their baseline and the heap comes back near it: no goroutine, connection or memory
// leak. Bounded: 8 s by default, ROLTER_SOAK_SECS up to 60; loopback only.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test skipped in -short mode")
	}
	dur := 8 * time.Second
	if s, err := strconv.Atoi(os.Getenv("ROLTER_SOAK_SECS")); err == nil && s > 0 {
		dur = time.Duration(min(s, 60)) * time.Second
	}
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			sseEvents(5+rand.IntN(20), time.Duration(1+rand.IntN(3))*time.Millisecond)(w, r)
			return
		}
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		okJSON(w, r)
	})
	gw := startGateway(t, gatewayConfig("least_load", "[retry]\nbackoff_ms = 1\n", up.URL, up.URL))
	soak(t, gw, dur)
}

// TestSoakDisaggregated is TestSoak on a disaggregated route: every request is a prefill hop and a decode
// hop, and clients leave during either.
func TestSoakDisaggregated(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test skipped in -short mode")
	}
	p := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(time.Duration(rand.IntN(4)) * time.Millisecond)
		prefillOK("p")(w, r)
	})
	d := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			sseEvents(5+rand.IntN(20), time.Duration(1+rand.IntN(3))*time.Millisecond)(w, r)
			return
		}
		time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
		okJSON(w, r)
	})
	gw := startGateway(t, pdFakes([]string{p.URL, p.URL}, []string{d.URL, d.URL}, "cache_aware", "prefill_threshold_tokens = 0",
		"[retry]\nbackoff_ms = 1\n"))
	soak(t, gw, 5*time.Second)
}

// soak is the load, the client disconnects and the leak checks of the soak tests, for dur.
func soak(t *testing.T, gw *testGateway, dur time.Duration) {
	settle := func() (int, uint64) {
		testClient.CloseIdleConnections()
		for _, p := range gw.g.Snapshot().Providers {
			p.up.closeIdle(false)
		}
		var ms runtime.MemStats
		for i := 0; i < 3; i++ {
			runtime.GC()
		}
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.HeapAlloc
	}
	// Warm up pools, then take the baseline.
	for i := 0; i < 20; i++ {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "warm", i%2 == 0))
	}
	time.Sleep(100 * time.Millisecond)
	baseG, baseHeap := settle()

	var ok, cut, failed atomic.Int64
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for w := 0; w < 96; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for time.Now().Before(deadline) {
				stream := rand.IntN(2) == 0
				body := chatBody("m", fmt.Sprintf("worker %d %d", w, rand.Int()), stream)
				switch rand.IntN(6) {
				case 0: // disconnect after reading a little (mid-stream for streams)
					if soakCut(gw.addr, body, true) {
						cut.Add(1)
					}
				case 1: // disconnect while the upstream is working, before any byte
					if soakCut(gw.addr, body, false) {
						cut.Add(1)
					}
				default:
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					req, _ := http.NewRequestWithContext(ctx, "POST", gw.URL+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("Content-Type", "application/json")
					resp, err := testClient.Do(req)
					if err != nil {
						failed.Add(1)
						t.Logf("request error: %s", err)
						cancel()
						continue
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					cancel()
					if err != nil || resp.StatusCode != 200 || (stream && !strings.HasSuffix(string(b), "data: [DONE]\n\n")) {
						failed.Add(1)
						t.Logf("failed: status %d err %v body %.300q", resp.StatusCode, err, b)
						continue
					}
					ok.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	t.Logf("soak %s: %d ok, %d cut by the client, %d failed", dur, ok.Load(), cut.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Fatalf("%d requests failed", failed.Load())
	}
	if ok.Load() < 100 || cut.Load() < 20 {
		t.Fatalf("too little traffic to mean anything: %d ok, %d cut", ok.Load(), cut.Load())
	}
	for _, p := range gw.g.Snapshot().Providers {
		waitFor(t, 5*time.Second, "in-flight to drain", func() bool { return p.Inflight() == 0 })
	}
	var g int
	var heap uint64
	deadlineG := time.Now().Add(10 * time.Second)
	for {
		g, heap = settle()
		if g <= baseG+2 {
			break
		}
		if time.Now().After(deadlineG) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines %d, baseline %d:\n%s", g, baseG, summariseStacks(string(buf[:n])))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("goroutines %d -> %d, heap %d KiB -> %d KiB", baseG, g, baseHeap>>10, heap>>10)
	if heap > baseHeap+16<<20 {
		t.Fatalf("heap grew from %d KiB to %d KiB", baseHeap>>10, heap>>10)
	}
}

// soakCut sends a request on a raw connection and closes it early: after the first body bytes when
// afterBytes, else right after the request is sent plus a short random delay. It reports whether it cut.
func soakCut(addr, body string, afterBytes bool) bool {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return false
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if !afterBytes {
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
		return true
	}
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = br.ReadString('\n')
	return err == nil
}

// summariseStacks counts goroutines by their top frames, for leak reports.
func summariseStacks(dump string) string {
	counts := map[string]int{}
	for _, g := range strings.Split(dump, "\n\n") {
		lines := strings.Split(g, "\n")
		key := ""
		for i := 1; i < len(lines) && i < 9; i += 2 {
			f := strings.TrimSpace(lines[i])
			if j := strings.LastIndexByte(f, '('); j > 0 {
				f = f[:j]
			}
			key += f + " | "
		}
		counts[key]++
	}
	var b strings.Builder
	for k, n := range counts {
		fmt.Fprintf(&b, "%4d %s\n", n, k)
	}
	return b.String()
}
