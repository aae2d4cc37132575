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
	"testing"
	"time"
)

// seen is one request as a recordingServer saw it.
type seen struct {
	content    string // the last message's content
	session    string
	maxTokens  int
	start, end time.Time
}

// recordingServer answers every chat request with a short stream after delay and records it.
type recordingServer struct {
	URL   string
	delay time.Duration

	mu   sync.Mutex
	reqs map[string]*seen // by content
}

func newRecordingServer(t *testing.T, delay time.Duration) *recordingServer {
	t.Helper()
	s := &recordingServer{delay: delay, reqs: map[string]*seen{}}
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

func (s *recordingServer) serve(w http.ResponseWriter, r *http.Request) {
	sn := &seen{start: time.Now(), session: r.Header.Get(SessionHeader)}
	data, _ := io.ReadAll(r.Body)
	var body chatBody
	_ = json.Unmarshal(data, &body)
	sn.maxTokens = body.MaxTokens
	if len(body.Messages) > 0 {
		sn.content = body.Messages[len(body.Messages)-1].Content
	}
	time.Sleep(s.delay)
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"content":"ok"}}]}`+"\n\n")
	fmt.Fprint(w, `data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`+"\n\ndata: [DONE]\n\n")
	sn.end = time.Now()
	s.mu.Lock()
	s.reqs[sn.content] = sn
	s.mu.Unlock()
}

func explicit(reqs ...Request) *Plan {
	return &Plan{Workload: Workload{Scenario: "replay", OutputTokens: 3}, Requests: reqs}
}

func ask(content string) []Message { return []Message{{Role: "user", Content: content}} }

// TestExplicitPlan: an explicit plan is sent as planned: each request's max_tokens and
// x-session-id, and a request waiting on an earlier one starts only after that one ended, while
// the others run concurrently.
func TestExplicitPlan(t *testing.T) {
	srv := newRecordingServer(t, 60*time.Millisecond)
	plan := explicit(
		Request{Group: 0, Messages: ask("a1"), Session: "a", MaxTokens: 5},
		Request{Group: 1, Messages: ask("b1"), Session: "b"},
		Request{Group: 0, Messages: ask("a2"), Session: "a", After: 1, MaxTokens: 7},
		Request{Group: 0, Messages: ask("a3"), Session: "a", After: 3},
		Request{Group: -1, Messages: ask("x")},
	)
	res, err := Run(context.Background(), Options{URL: srv.URL, Plan: plan, Concurrency: 4, KeepSamples: true, Duration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.Succeeded != 5 || res.Scenario != "replay" || res.Planned != 5 {
		t.Fatalf("%d of %d ok, scenario %q: %v", res.Succeeded, res.Planned, res.Scenario, res.Errors)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	f := func(content, session string, maxTokens int, after string) {
		t.Helper()
		s := srv.reqs[content]
		if s == nil || s.session != session || s.maxTokens != maxTokens {
			t.Fatalf("%s: got %+v, want session %q, max_tokens %d", content, s, session, maxTokens)
		}
		if after != "" && s.start.Before(srv.reqs[after].end) {
			t.Fatalf("%s started %s before %s ended", content, srv.reqs[after].end.Sub(s.start), after)
		}
	}
	f("a1", "a", 5, "")
	f("b1", "b", 3, "")
	f("a2", "a", 7, "a1")
	f("a3", "a", 3, "a2")
	f("x", "", 3, "")
	// The requests without a dependency did not wait for the session's chain.
	if srv.reqs["x"].start.After(srv.reqs["a1"].end) {
		t.Fatalf("x waited for a1")
	}
	for _, s := range res.Samples {
		want := map[string]string{"a1": "a", "a2": "a", "a3": "a", "b1": "b", "x": ""}[s.Prompt[0].Content]
		if s.Session != want {
			t.Fatalf("sample %+v: session %q, want %q", s, s.Session, want)
		}
	}
}

// TestExplicitPlanTimed: a Timed plan sends each request at its time.
func TestExplicitPlanTimed(t *testing.T) {
	srv := newRecordingServer(t, 0)
	plan := explicit(
		Request{Group: -1, Messages: ask("t0")},
		Request{Group: -1, Messages: ask("t1"), At: 150 * time.Millisecond},
		Request{Group: -1, Messages: ask("t2"), At: 150 * time.Millisecond},
		Request{Group: -1, Messages: ask("t3"), At: 400 * time.Millisecond},
	)
	plan.Timed = true
	res, err := Run(context.Background(), Options{URL: srv.URL, Plan: plan, Concurrency: 8, Rate: 1000, Duration: 20 * time.Second})
	if err != nil || res.Succeeded != 4 {
		t.Fatalf("%v: %+v", err, res)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	t0 := srv.reqs["t0"].start
	for i, at := range []time.Duration{0, 150 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond} {
		got := srv.reqs[fmt.Sprint("t", i)].start.Sub(t0)
		if got < at-5*time.Millisecond || got > at+100*time.Millisecond {
			t.Fatalf("t%d sent at %s, want %s", i, got, at)
		}
	}
}

func TestExplicitPlanInvalid(t *testing.T) {
	f := func(p *Plan, want string) {
		t.Helper()
		_, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Plan: p})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q", err, want)
		}
	}
	ok := Request{Group: -1, Messages: ask("q")}
	f(explicit(), "no request")
	f(&Plan{Workload: Workload{OutputTokens: 1}, Conversations: []Conversation{{}}}, "not conversations")
	f(explicit(ok, Request{Messages: ask("q"), After: 2}), "request 1: after 2 must name an earlier request")
	f(explicit(ok, Request{Messages: nil}), "request 1 has no message")
	f(explicit(ok, Request{Messages: ask("q"), At: -time.Second}), "must not be negative")
	f(&Plan{Requests: []Request{ok}}, "max tokens 0 must be > 0")
	p := explicit(Request{Messages: ask("q"), At: time.Second}, ok)
	p.Timed = true
	f(p, "request 1: send time 0s is before the previous request's 1s")
}

// TestCapacityOracle: with room for everything it is the Oracle; with less it forgets the least
// recently used blocks, a prompt's tail before its head.
func TestCapacityOracle(t *testing.T) {
	prompts := [][]uint32{seq(1, 9), seq(1, 9), cat(seq(1, 4), seq(50, 9)), seq(100, 17), cat(seq(1, 8), []uint32{7}), seq(1, 13)}
	inf, big := NewOracle(4), NewCapacityOracle(4, 1000)
	for _, p := range prompts {
		if a, b := inf.AddTokens(p), big.AddTokens(p); a != b {
			t.Fatalf("prompt %v: oracle hit %d, capacity oracle %d", p, a, b)
		}
	}
	if inf.HitRate() != big.HitRate() {
		t.Fatalf("hit rates %v and %v", inf.HitRate(), big.HitRate())
	}

	o := NewCapacityOracle(4, 4)
	f := func(prompt []uint32, wantHit int) {
		t.Helper()
		if got := o.AddTokens(prompt); got != wantHit {
			t.Fatalf("prompt %v: hit %d, want %d", prompt, got, wantHit)
		}
	}
	f(seq(1, 13), 0)                // A B C cached (most recent first: A B C)
	f(seq(1, 13), 12)               // all three
	f(seq(100, 9), 0)               // D E A B C: over 4, C (A's tail) goes
	f(seq(1, 13), 8)                // A B hit, C computed again: A B C D E, E (D's tail) goes
	f(seq(100, 9), 4)               // D hits, E computed again: D E A B C, C goes
	f(cat(seq(1, 4), seq(9, 5)), 4) // A hits; tokens 9..12 after A are not C
	if p, h := o.Totals(); p != 13+13+9+13+9+9 || h != 12+8+4+4 {
		t.Fatalf("totals %d/%d", h, p)
	}
}

// TestExplicitPlanManySessions: interleaved sessions, closed loop and timed: every request is
// sent once, after its session's previous one ended.
func TestExplicitPlanManySessions(t *testing.T) {
	for _, timed := range []bool{false, true} {
		srv := newRecordingServer(t, 3*time.Millisecond)
		plan := explicit()
		plan.Timed = timed
		last := map[int]int{}
		for i := 0; i < 120; i++ {
			s := (i * 7) % 12
			r := Request{Group: s, Messages: ask(fmt.Sprint("r", i)), Session: fmt.Sprint("s", s), At: time.Duration(i) * time.Millisecond}
			if p, ok := last[s]; ok {
				r.After = p + 1
			}
			last[s] = i
			plan.Requests = append(plan.Requests, r)
		}
		res, err := Run(context.Background(), Options{URL: srv.URL, Plan: plan, Concurrency: 5, Duration: 30 * time.Second})
		if err != nil || res.Succeeded != 120 || res.Sent != 120 {
			t.Fatalf("timed %v: %v, %d of %d ok", timed, err, res.Succeeded, res.Sent)
		}
		srv.mu.Lock()
		for i, r := range plan.Requests {
			if r.After == 0 {
				continue
			}
			me, prev := srv.reqs[fmt.Sprint("r", i)], srv.reqs[fmt.Sprint("r", r.After-1)]
			if me.start.Before(prev.end) {
				t.Fatalf("timed %v: r%d started before r%d ended", timed, i, r.After-1)
			}
		}
		srv.mu.Unlock()
	}
}
