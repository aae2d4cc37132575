package loadtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pacedServer is an OpenAI-style upstream on loopback: it sends the response headers at once,
// the first event after firstDelay, then two more events gap apart, a usage event and [DONE]
// (or, for stream: false, one JSON body after the whole time). It names itself in
// x-rolter-target, alternating "a" and "b".
type pacedServer struct {
	URL        string
	firstDelay time.Duration
	gap        time.Duration
	hang       bool
	n          atomic.Int64
	handle     func(body map[string]any) // optional: sees every request body

	mu sync.Mutex
}

func newPacedServer(t *testing.T, firstDelay, gap time.Duration) *pacedServer {
	t.Helper()
	s := &pacedServer{firstDelay: firstDelay, gap: gap}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(s.serve)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s.URL = "http://" + ln.Addr().String()
	return s
}

func (s *pacedServer) serve(w http.ResponseWriter, r *http.Request) {
	n := s.n.Add(1)
	data, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(data, &body)
	if s.handle != nil {
		s.mu.Lock()
		s.handle(body)
		s.mu.Unlock()
	}
	w.Header().Set("X-Rolter-Target", []string{"a", "b"}[n%2])
	w.Header().Set("X-Rolter-Decision", "round_robin")
	sleep := func(d time.Duration) bool {
		select {
		case <-time.After(d):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	if s.hang {
		sleep(time.Minute)
		return
	}
	usage := `"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":30}}`
	if stream, _ := body["stream"].(bool); !stream {
		if !sleep(s.firstDelay + 2*s.gap) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"answer-%d"}}],%s}`, n, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	fl.Flush() // headers now, like vLLM
	if !sleep(s.firstDelay) {
		return
	}
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`+"\n\n")
	fl.Flush()
	for i := 0; i < 2; i++ {
		if !sleep(s.gap) {
			return
		}
		fmt.Fprintf(w, `data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}`+"\n\n", []string{"answer", fmt.Sprintf("-%d", n)}[i])
		fl.Flush()
	}
	fmt.Fprint(w, `data: {"choices":[],`+usage+"}\n\ndata: [DONE]\n\n")
}

// TestTTFT: the time to first byte is the first body byte (after firstDelay), not the headers,
// and the latency runs to the end of the stream.
func TestTTFT(t *testing.T) {
	const first, gap = 120 * time.Millisecond, 50 * time.Millisecond
	s := newPacedServer(t, first, gap)
	w := DefaultWorkload(Random)
	w.Requests, w.QuestionTokens = 6, 8
	res, err := Run(context.Background(), Options{URL: s.URL, Workload: w, Concurrency: 3, Duration: 20 * time.Second, KeepSamples: true, Targets: []string{"a", "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded != 6 || res.Failed != 0 {
		t.Fatalf("ok %d failed %d (%v); want 6, 0", res.Succeeded, res.Failed, res.Errors)
	}
	for _, s := range res.Samples {
		if s.TTFTMs < ms(first) {
			t.Fatalf("TTFT %.1f ms is before the first byte was sent (%v): headers were timed", s.TTFTMs, first)
		}
		// The server cannot finish before first+2*gap after it received the request, which the
		// client sent after its clock started; comparing with TTFT instead would fail whenever the
		// client read the first byte late.
		if s.LatencyMs < ms(first+2*gap) {
			t.Fatalf("latency %.1f ms < %v: the end of the stream was not timed", s.LatencyMs, first+2*gap)
		}
	}
	if res.HitRate != 0.75 || res.PromptTokens != 6*40 {
		t.Fatalf("hit rate %v over %d prompt tokens; want 0.75 over 240", res.HitRate, res.PromptTokens)
	}
	if res.ShareMaxMin != 1 || len(res.Targets) != 2 || res.Targets[0].Requests != 3 || res.Decisions["round_robin"] != 6 {
		t.Fatalf("share %v targets %+v decisions %v; want 1, a/b 3 each, round_robin 6", res.ShareMaxMin, res.Targets, res.Decisions)
	}

	// Not streaming, the first byte comes with the whole answer.
	res, err = Run(context.Background(), Options{URL: s.URL, Workload: w, Concurrency: 3, NonStream: true, KeepSamples: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res.Samples {
		if s.TTFTMs < ms(first+2*gap) || s.Error != "" {
			t.Fatalf("non-stream TTFT %.1f ms (error %q); want >= %v", s.TTFTMs, s.Error, first+2*gap)
		}
	}
	if res.HitRate != 0.75 {
		t.Fatalf("non-stream hit rate %v", res.HitRate)
	}
}

// TestRunBoundedInTime: requests that never answer are cancelled when Duration runs out.
func TestRunBoundedInTime(t *testing.T) {
	s := newPacedServer(t, 0, 0)
	s.hang = true
	w := DefaultWorkload(Random)
	w.Requests, w.QuestionTokens = 50, 8
	start := time.Now()
	res, err := Run(context.Background(), Options{URL: s.URL, Workload: w, Concurrency: 4, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("run took %v with a 300ms bound", took)
	}
	if res.Succeeded != 0 || res.Cancelled != 4 || res.Sent != 4 {
		t.Fatalf("ok %d cancelled %d sent %d; want 0, 4, 4 (%v)", res.Succeeded, res.Cancelled, res.Sent, res.Errors)
	}
}

// TestRunCountBound: MaxRequests stops the run.
func TestRunCountBound(t *testing.T) {
	s := newPacedServer(t, 0, 0)
	w := DefaultWorkload(Random)
	w.Requests, w.QuestionTokens = 50, 8
	res, err := Run(context.Background(), Options{URL: s.URL, Workload: w, Concurrency: 4, MaxRequests: 7})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 7 || res.Succeeded != 7 || s.n.Load() != 7 {
		t.Fatalf("sent %d ok %d served %d; want 7", res.Sent, res.Succeeded, s.n.Load())
	}
	// Open loop too.
	res, err = Run(context.Background(), Options{URL: s.URL, Workload: w, Rate: 200, MaxRequests: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 5 || res.Mode != "open" {
		t.Fatalf("open loop sent %d mode %s", res.Sent, res.Mode)
	}
}

// TestMultiTurnOrder: round r of a user carries the answers of rounds < r and is sent after them.
func TestMultiTurnOrder(t *testing.T) {
	s := newPacedServer(t, 5*time.Millisecond, time.Millisecond)
	rounds := map[string]int{} // user's system prompt -> rounds seen
	var bad []string
	s.handle = func(body map[string]any) {
		msgs, _ := body["messages"].([]any)
		sys := msgs[0].(map[string]any)["content"].(string)
		r := rounds[sys]
		if want := 2 + 2*r; len(msgs) != want {
			bad = append(bad, fmt.Sprintf("round %d with %d messages, want %d", r, len(msgs), want))
		}
		for i := 2; i < len(msgs); i += 2 {
			m := msgs[i].(map[string]any)
			if m["role"] != "assistant" || !strings.HasPrefix(m["content"].(string), "answer-") {
				bad = append(bad, fmt.Sprintf("message %d is %v, want an earlier answer", i, m))
			}
		}
		rounds[sys] = r + 1
	}
	w := Workload{Scenario: MultiTurn, Seed: 2, Users: 5, Rounds: 3, SystemTokens: 10, HistoryTokens: 5, QuestionTokens: 4, OutputTokens: 2}
	res, err := Run(context.Background(), Options{URL: s.URL, Workload: w, Concurrency: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded != 15 || len(bad) > 0 {
		t.Fatalf("ok %d of 15; problems: %v", res.Succeeded, bad)
	}
	if len(rounds) != 5 {
		t.Fatalf("%d users seen, want 5", len(rounds))
	}
}

func TestRunRefusesRemote(t *testing.T) {
	_, err := Run(context.Background(), Options{URL: "http://192.0.2.1:8080", Workload: DefaultWorkload(Random)})
	if err == nil || !strings.Contains(err.Error(), "not a loopback") {
		t.Fatalf("got %v; want a loopback refusal", err)
	}
	_, err = Run(context.Background(), Options{URL: "http://127.0.0.1:1", TokenizeURL: "http://192.0.2.1", Workload: DefaultWorkload(Random)})
	if err == nil || !strings.Contains(err.Error(), "not a loopback") {
		t.Fatalf("got %v; want a loopback refusal of the tokenize URL", err)
	}
}

func TestMainFlags(t *testing.T) {
	var out, errOut strings.Builder
	if code := mainWithStderr([]string{"-h"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "-scenario") {
		t.Fatalf("-h: code %d, stdout %q", code, out.String())
	}
	if code := mainWithStderr([]string{"-url", "http://10.1.2.3"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "loopback") {
		t.Fatalf("remote URL: code %d, stderr %q", code, errOut.String())
	}
	if code := mainWithStderr([]string{"-scenario", "bogus"}, &out, &errOut); code != 2 {
		t.Fatalf("bad scenario: code %d", code)
	}
	o, _, err := ParseFlags([]string{"-scenario", "hot-prefix", "-requests", "9", "-targets", "sim-1, sim-2"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Workload.Requests != 9 || o.Workload.SystemTokens != 2048 || len(o.Targets) != 2 || o.Targets[1] != "sim-2" {
		t.Fatalf("got %+v", o)
	}
}
