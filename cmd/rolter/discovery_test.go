package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/netns"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"github.com/rolter-ai/rolter/sim"
)

// The discovery tests run what `rolter serve` runs (newGateway: the sources, the fleet, the gateway) in a
// network namespace of their own (internal/netns), where simulated vLLM engines listen on 10.213.0.x, the
// addresses a Kubernetes API server accepts in EndpointSlices and DNS hands out; nothing leaves lo.

// enginePort is the port every engine of a rig listens on: one port, many addresses, as pods have.
const enginePort = 8000

// rig is a gateway over a fleet of simulated engines, with a bounded load running against it. The configs
// give cache_aware an overload margin the load never reaches: what the tests check is the routing memory
// across fleet changes, and a burst of the load on the repeated prompt's engine just as an idle one joins
// would otherwise spill the prompt there, as the rule says it must.
type rig struct {
	t       *testing.T
	gw      *gateway
	url     string
	engines map[int]*sim.Engine // by netns address index
	log     *syncbuf.Buffer

	sent, failed atomic.Int64
	stop         chan struct{}
	wg           sync.WaitGroup
}

// startEngines starts a simulated engine on netns.Addr(i) for each i: streams of 12 tokens 25 ms apart,
// so one outlives the changes a test makes around it.
func (r *rig) startEngines(idx ...int) {
	for _, i := range idx {
		cfg := sim.DefaultConfig()
		cfg.Host, cfg.Port, cfg.Model, cfg.EngineLabel = netns.Addr(i).String(), enginePort, "m", fmt.Sprint(i)
		cfg.DecodePerToken, cfg.MaxTokens = 25*time.Millisecond, 12
		e, err := sim.New(cfg)
		if err != nil {
			r.t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			r.t.Fatal(err)
		}
		r.t.Cleanup(e.Stop)
		r.engines[i] = e
	}
}

// newRig starts engines 1..n and the gateway on the config text, sources and all.
func newRig(t *testing.T, n int, text string) *rig {
	t.Helper()
	r := &rig{t: t, engines: map[int]*sim.Engine{}, log: &syncbuf.Buffer{}, stop: make(chan struct{})}
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i + 1
	}
	r.startEngines(idx...)
	path := filepath.Join(t.TempDir(), "rolter.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(r.log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if r.gw, err = newGateway(cfg, log); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go r.gw.g.Serve(ln)
	t.Cleanup(func() {
		close(r.stop)
		r.wg.Wait()
		_ = r.gw.g.Shutdown(t.Context())
		r.gw.close()
		if t.Failed() {
			t.Logf("gateway log:\n%s", r.log.String())
		}
	})
	r.url = "http://" + ln.Addr().String()
	return r
}

// load runs c clients sending distinct prompts until the test ends; every answer must be a 200.
func (r *rig) load(c int) {
	for k := range c {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-r.stop:
					return
				default:
				}
				status, _, _ := r.chatN(fmt.Sprintf("%x: a question of client %d", uint32(i*2654435761+k), k), 1)
				r.sent.Add(1)
				if status != 200 {
					r.failed.Add(1)
					r.t.Errorf("a request under load answered %d", status)
				}
			}
		}()
	}
}

// chat sends one chat request and returns its status, the target and decision headers.
func (r *rig) chat(prompt string) (status int, target, decision string) {
	return r.chatN(prompt, 12)
}

// chatN is chat with max_tokens n: the load's requests take one token, so they hold an engine for
// milliseconds and the load stays bounded.
func (r *rig) chatN(prompt string, n int) (status int, target, decision string) {
	body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, n, prompt)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		r.t.Errorf("chat: %v", err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		r.t.Logf("chat answered %d: %s", resp.StatusCode, b)
	}
	return resp.StatusCode, resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision")
}

// stream starts a streamed chat and returns its target once the head has come, and a channel that gets
// nil when the stream ends with [DONE], or what went wrong.
func (r *rig) stream(prompt string) (string, <-chan error) {
	body := fmt.Sprintf(`{"model":"m","stream":true,"messages":[{"role":"user","content":%q}]}`, prompt)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		r.t.Fatalf("stream: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() == "data: [DONE]" {
				done <- nil
				return
			}
			if strings.Contains(sc.Text(), `"error"`) {
				done <- fmt.Errorf("the stream carried an error: %s", sc.Text())
				return
			}
		}
		done <- fmt.Errorf("the stream ended without [DONE] (status %d): %v", resp.StatusCode, sc.Err())
	}()
	return resp.Header.Get("X-Rolter-Target"), done
}

// targets returns route m's targets as the gateway serves them now.
func (r *rig) targets() []string {
	var out []string
	for _, rs := range r.gw.g.State().Routes {
		for _, t := range rs.Targets {
			out = append(out, t.Provider)
		}
	}
	return out
}

// waitTargets waits until route m's targets are exactly the endpoints at the netns indexes idx.
func (r *rig) waitTargets(what string, idx ...int) time.Duration {
	r.t.Helper()
	start := time.Now()
	want := map[string]bool{}
	for _, i := range idx {
		want[fmt.Sprintf("%s:%d", netns.Addr(i), enginePort)] = true
	}
	for {
		got := r.targets()
		ok := len(got) == len(want)
		for _, p := range got {
			_, addr, _ := strings.Cut(p, "@")
			addr, _, _ = strings.Cut(addr, "/")
			ok = ok && want[addr]
		}
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > 10*time.Second {
			r.t.Fatalf("%s: the gateway's targets are %v, want the endpoints %v", what, got, idx)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// served returns how many requests engine i received.
func (r *rig) served(i int) uint64 { return r.engines[i].Stats().Requests }

// waitServed waits until every engine of idx received a request it had not at the call, and returns how
// long that took.
func (r *rig) waitServed(what string, since time.Time, idx ...int) time.Duration {
	r.t.Helper()
	before := map[int]uint64{}
	for _, i := range idx {
		before[i] = r.served(i)
	}
	for {
		all := true
		for _, i := range idx {
			all = all && r.served(i) > before[i]
		}
		if all {
			return time.Since(since)
		}
		if time.Since(since) > 10*time.Second {
			r.t.Fatalf("%s: not every new engine took traffic within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// prefixHit sends the repeated prompt and checks it lands on target with a prefix_hit.
func (r *rig) prefixHit(what, prompt, target string) {
	r.t.Helper()
	status, got, decision := r.chat(prompt)
	if status != 200 || got != target || decision != "prefix_hit" {
		r.t.Fatalf("%s: the repeated prompt went to %q (%s, status %d), want a prefix_hit on %q", what, got, decision, status, target)
	}
}

// indexOf is the netns address index of a target name ("src@10.213.0.4:8000/uid" -> 4).
func indexOf(target string) int {
	_, addr, _ := strings.Cut(target, "@")
	addr, _, _ = strings.Cut(addr, ":")
	for i := 1; i < 256; i++ {
		if netns.Addr(i).String() == addr {
			return i
		}
	}
	return 0
}

// stateOf returns the state of the endpoint at netns index i in the source's status ("" if not seen).
func (r *rig) stateOf(source string, i int) string {
	for _, st := range r.gw.fleet.Status() {
		if st.Name != source {
			continue
		}
		for _, e := range st.Endpoints {
			if indexOf(e.Provider) == i {
				return e.State
			}
		}
	}
	return ""
}

// waitTargetsNamed waits until route m's target names satisfy ok.
func (r *rig) waitTargetsNamed(what string, ok func(names []string) bool) {
	r.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok(r.targets()) {
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: the gateway's targets are %v", what, r.targets())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// repeated is the prompt a rig sends again after each change, and the engine that holds it.
type repeated struct {
	prompt string
	home   string // its target
	h      int    // its engine's netns index
}

// remember sends the repeated prompt twice: the second time it must be a prefix_hit where the first went.
func (r *rig) remember() repeated {
	r.t.Helper()
	rp := repeated{prompt: "a repeated prompt: " + strings.Repeat("the same long context, ", 100)}
	_, rp.home, _ = r.chat(rp.prompt)
	rp.h = indexOf(rp.home)
	r.prefixHit("before any change", rp.prompt, rp.home)
	return rp
}

// grown checks a change made at changed that added the engines idx to a fleet of all: each takes traffic
// within 2 s, the targets are all, and the repeated prompt is still a prefix_hit where it was.
func (r *rig) grown(what string, changed time.Time, rp repeated, idx, all []int) {
	r.t.Helper()
	took := r.waitServed(what, changed, idx...)
	r.waitTargets(what, all...)
	r.prefixHit("right after "+what, rp.prompt, rp.home)
	r.t.Logf("%s: every new engine took traffic %v after the change", what, took.Round(time.Millisecond))
	if took > 2*time.Second {
		r.t.Fatalf("%s: the new engines took traffic %v after the change, over 2 s", what, took)
	}
}

// except returns 1..n without the indexes of skip.
func except(n int, skip ...int) []int {
	var out []int
	for i := 1; i <= n; i++ {
		if !slices.Contains(skip, i) {
			out = append(out, i)
		}
	}
	return out
}

// streamOn starts streams until one lands on an engine want accepts (the others are read to the end) and
// returns that engine's index and the stream's end.
func (r *rig) streamOn(want func(i int) bool) (int, <-chan error) {
	r.t.Helper()
	for i := range 50 {
		target, done := r.stream(fmt.Sprintf("%d: a long answer, please", i))
		if j := indexOf(target); want(j) {
			return j, done
		}
		if err := <-done; err != nil {
			r.t.Fatal(err)
		}
	}
	r.t.Fatal("no stream landed on an engine the test wanted")
	return 0, nil
}

// noneFailed checks that the load sent requests and none of them failed.
func (r *rig) noneFailed() {
	r.t.Helper()
	if n := r.failed.Load(); n > 0 || r.sent.Load() == 0 {
		r.t.Fatalf("%d of %d requests under load failed", n, r.sent.Load())
	}
	r.t.Logf("%d requests under load, none failed", r.sent.Load())
}

// replaced checks that the repeated prompt's engine came back as a new pod on its address (n targets,
// none of them the old one) and starts cold: the prompt is no prefix_hit there.
func (r *rig) replaced(rp repeated, n int) {
	r.t.Helper()
	r.waitTargetsNamed("the replaced pod", func(names []string) bool { return len(names) == n && !slices.Contains(names, rp.home) })
	_, got, decision := r.chat(rp.prompt)
	if decision == "prefix_hit" && indexOf(got) == rp.h {
		r.t.Fatalf("the repeated prompt was a prefix_hit on the new pod %q: it must start cold", got)
	}
	r.t.Logf("after the replacement the repeated prompt went to %s (%s)", got, decision)
}
