//go:build cgo

package engine

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/sim"
)

// preciseFleet starts n sims publishing KV events (with replay) and a precise_cache_aware gateway over them.
func preciseFleet(t *testing.T, n int, replay bool, tweak func(*sim.Config)) ([]*sim.Engine, *testGateway) {
	t.Helper()
	engines, _ := simFleet(t, n, func(c *sim.Config) {
		c.KVEvents = "tcp://127.0.0.1:*"
		if replay {
			c.Replay = "tcp://127.0.0.1:*"
		}
		if tweak != nil {
			tweak(c)
		}
	})
	gw := startGateway(t, preciseConfig(engines, replay, ""))
	// Late joiners see nothing until a first batch; give the SUB sockets a moment to connect (slow joiner).
	time.Sleep(200 * time.Millisecond)
	return engines, gw
}

// preciseConfig renders a precise_cache_aware route over engines (providers sim-0, sim-1, ...) with params.
func preciseConfig(engines []*sim.Engine, replay bool, params string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, e := range engines {
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n[providers.kv_events]\nendpoint = %q\nstale_secs = 60\n", i, e.URL(), e.KVEventsEndpoint())
		if replay {
			fmt.Fprintf(&b, "replay_endpoint = %q\n", e.ReplayEndpoint())
		}
	}
	b.WriteString("[[routes]]\nmodel = \"m\"\nstrategy = \"precise_cache_aware\"\n")
	if params != "" {
		b.WriteString("[routes.params]\n" + params + "\n")
	}
	for i := range engines {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"sim-%d\"\nmodel = \"sim-model\"\n", i)
	}
	return b.String()
}

// tokenize asks a sim for the chat-templated token ids of msgs, as a vLLM client would.
func tokenize(t *testing.T, e *sim.Engine, msgs []chatMsg) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "add_generation_prompt": true})
	resp, got := post(t, e.URL()+"/tokenize", string(body))
	if resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, got)
	}
	var r struct{ Tokens []uint32 }
	if err := json.Unmarshal([]byte(got), &r); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(r.Tokens))
	for i, v := range r.Tokens {
		ids[i] = fmt.Sprint(v)
	}
	return strings.Join(ids, ",")
}

// preciseTurn sends msgs with their token ids and returns target and decision.
func preciseTurn(t *testing.T, gw *testGateway, msgs []chatMsg, ids string) (string, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 2})
	hdr := []string{}
	if ids != "" {
		hdr = []string{"X-Rolter-Vllm-Token-Ids", ids}
	}
	resp, got := post(t, gw.URL+"/v1/chat/completions", string(body), hdr...)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	return resp.Header.Get("X-Rolter-Target"), resp.Header.Get("X-Rolter-Decision")
}

func longConversation(tag string) []chatMsg {
	return []chatMsg{{"system", strings.Repeat("precise routing test "+tag+" ", 40)}, {"user", "question about " + tag}}
}

// waitPinned sends msgs once, waits until the serving engine's BlockStored events reached the index, and
// checks that the same ids now pin there. It returns that target.
func waitPinned(t *testing.T, gw *testGateway, msgs []chatMsg, ids string) string {
	t.Helper()
	kv := gw.g.Snapshot().kv
	before := map[string]uint64{}
	for name, src := range kv {
		before[name] = src.st.Stats().StoredEvents
	}
	target, decision := preciseTurn(t, gw, msgs, ids)
	if decision == "prefix_hit" {
		return target
	}
	st := kv[target].st
	waitFor(t, 5*time.Second, "the BlockStored events of "+target, func() bool { return st.Stats().StoredEvents > before[target] && st.Trusted() })
	again, decision := preciseTurn(t, gw, msgs, ids)
	if again != target || decision != "prefix_hit" {
		t.Fatalf("blocks are on %s; the same ids went to %s (%s)", target, again, decision)
	}
	return target
}

// waitResident waits until the index holds the blocks of ids on provider (without sending traffic).
func waitResident(t *testing.T, gw *testGateway, provider, ids string) {
	t.Helper()
	toks, ok := parseTokenIDs(nil, []byte(ids))
	if !ok {
		t.Fatalf("bad ids %q", ids)
	}
	ix, src := gw.g.kv.ix, gw.g.Snapshot().kv[provider]
	out := make([]int, ix.MaxTargets())
	var s kvindex.Scratch
	waitFor(t, 5*time.Second, "the blocks to be resident on "+provider, func() bool {
		full := ix.Match(toks, &s, out)
		return full > 0 && out[src.id] == full
	})
}

// waitStored waits until the index has applied n BlockStored events of provider in total.
func waitStored(t *testing.T, gw *testGateway, provider string, n uint64) {
	t.Helper()
	st := gw.g.Snapshot().kv[provider].st
	waitFor(t, 5*time.Second, "BlockStored events of "+provider, func() bool { return st.Stats().StoredEvents >= n })
}

func TestPrecisePinsWhereBlocksAre(t *testing.T) {
	engines, gw := preciseFleet(t, 3, true, nil)
	msgs := longConversation("a")
	ids := tokenize(t, engines[0], msgs)
	first, decision := preciseTurn(t, gw, msgs, ids)
	if decision != "home" && decision != "untrusted" { // untrusted: no batch heard yet from any engine
		t.Fatalf("cold request decided %s", decision)
	}
	waitStored(t, gw, first, 1)
	for i := 0; i < 5; i++ {
		if got, d := preciseTurn(t, gw, msgs, ids); got != first || d != "prefix_hit" {
			t.Fatalf("the same token ids went to %s (%s), blocks are on %s", got, d, first)
		}
	}
	// A different conversation is not pinned to the first one's engine by accident.
	other := longConversation("b")
	if _, d := preciseTurn(t, gw, other, tokenize(t, engines[0], other)); d != "home" {
		t.Fatalf("unrelated prompt decided %s", d)
	}
	// Ids missing or malformed: the approximate trie still knows where the prompt went; for a prompt it
	// does not know, least load, and the decision says why.
	if got, d := preciseTurn(t, gw, msgs, ""); got != first || d != "prefix_hit" {
		t.Fatalf("no ids: %s (%s), want prefix_hit on %s from the trie", got, d, first)
	}
	if _, d := preciseTurn(t, gw, longConversation("c"), ""); d != "no_token_ids" {
		t.Fatalf("no ids, unknown prompt decided %s", d)
	}
	for i, bad := range []string{"1,2,x", "1,,2", "1, 2", ",1", "99999999999", "-1"} {
		if _, d := preciseTurn(t, gw, longConversation(fmt.Sprint("bad", i)), bad); d != "bad_token_ids" {
			t.Fatalf("ids %q decided %s", bad, d)
		}
	}
	// The gateway exports the stream state.
	_, metrics := getMetrics(t, gw)
	for _, want := range []string{`rolter_kv_stream_trusted{target="` + first + `"} 1`, `rolter_kv_events_total{target=`, `rolter_kv_index_blocks{target=`} {
		if !strings.Contains(metrics, want) {
			t.Fatalf("/metrics lacks %q", want)
		}
	}
}

// TestPreciseEviction: once the engine evicts a prompt's blocks (BlockRemoved), the prompt no longer pins.
func TestPreciseEviction(t *testing.T) {
	engines, gw := preciseFleet(t, 2, true, func(c *sim.Config) { c.NumBlocks = 96 })
	msgs := longConversation("evict")
	ids := tokenize(t, engines[0], msgs)
	home := waitPinned(t, gw, msgs, ids)
	var e *sim.Engine
	for i, en := range engines {
		if home == fmt.Sprintf("sim-%d", i) {
			e = en
		}
	}
	// Fill the home engine's cache with other prompts, sent to it directly.
	for i := 0; i < 12; i++ {
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": longConversation(fmt.Sprint("filler-", i))})
		post(t, e.URL()+"/v1/chat/completions", string(body))
	}
	if e.Stats().Evictions == 0 {
		t.Fatalf("the filler did not evict anything: %+v", e.Stats())
	}
	waitFor(t, 5*time.Second, "the evicted prompt to stop pinning", func() bool {
		_, d := preciseTurn(t, gw, msgs, ids)
		return d == "home"
	})
}

// TestPreciseGapReplay: a dropped batch makes the stream untrusted; replay restores trust.
func TestPreciseGapReplay(t *testing.T) {
	engines, gw := preciseFleet(t, 1, true, nil)
	msgs := longConversation("gap")
	ids := tokenize(t, engines[0], msgs)
	waitPinned(t, gw, msgs, ids)
	st := gw.g.Snapshot().kv["sim-0"].st
	if err := engines[0].SetFaults(sim.Faults{DropEveryNthBatch: 1}); err != nil {
		t.Fatal(err)
	}
	// One more batch is produced (and dropped): the next one reveals the gap.
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": longConversation("gap-2")})
	post(t, engines[0].URL()+"/v1/chat/completions", string(body))
	waitFor(t, 2*time.Second, "the sim to drop a batch", func() bool { return engines[0].Stats().BatchesDropped >= 1 })
	engines[0].SetFaults(sim.Faults{})
	body, _ = json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": longConversation("gap-3")})
	post(t, engines[0].URL()+"/v1/chat/completions", string(body))
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := st.Stats()
		if s.Gaps >= 1 && s.ReplaysOK >= 1 && st.Trusted() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gap not replayed: %+v, sim %+v", s, engines[0].Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The replayed batch was applied: gap-2's blocks are known.
	gap2 := longConversation("gap-2")
	gap2IDs := tokenize(t, engines[0], gap2)
	waitResident(t, gw, "sim-0", gap2IDs)
	if got, d := preciseTurn(t, gw, gap2, gap2IDs); got != "sim-0" || d != "prefix_hit" {
		t.Fatalf("replayed prompt: %s %s", got, d)
	}
}

// TestPreciseRestartAndGarbage: an engine restart (sequence back to 0, AllBlocksCleared) drops its blocks and
// the stream is trusted again afterwards; garbage frames are counted and survived.
func TestPreciseRestartAndGarbage(t *testing.T) {
	engines, gw := preciseFleet(t, 2, false, nil)
	msgs := longConversation("restart")
	ids := tokenize(t, engines[0], msgs)
	home := waitPinned(t, gw, msgs, ids)
	idx := 0
	if home == "sim-1" {
		idx = 1
	}
	st := gw.g.Snapshot().kv[home].st
	engines[idx].Restart()
	waitFor(t, 5*time.Second, "the restart to clear the engine's blocks", func() bool {
		return st.Stats().ClearedEvents+st.Stats().Restarts >= 1 && st.Stats().Blocks == 0
	})
	if _, d := preciseTurn(t, gw, msgs, ids); d == "prefix_hit" {
		t.Fatalf("a restarted engine's old blocks still pin")
	}
	waitFor(t, 5*time.Second, "trust after the restart", st.Trusted)

	if err := engines[idx].SetFaults(sim.Faults{GarbageEveryNBatches: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": longConversation(fmt.Sprint("garbage-", i))})
		post(t, engines[idx].URL()+"/v1/chat/completions", string(body))
	}
	waitFor(t, 5*time.Second, "garbage frames to be counted", func() bool { return st.Stats().GarbageFrames >= 1 })
	g := longConversation("garbage-after")
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1, "messages": g})
	post(t, engines[idx].URL()+"/v1/chat/completions", string(body))
	gids := tokenize(t, engines[idx], g)
	waitResident(t, gw, home, gids)
	if got, d := preciseTurn(t, gw, g, gids); got != home || d != "prefix_hit" {
		t.Fatalf("after garbage frames the prompt went to %s (%s), its blocks are on %s;", got, d, home)
	}
}

// TestReloadKeepsKVStream: a reload that leaves a provider's kv_events in place keeps its subscription: the
// stream stays trusted without a replay and the same ids still pin where their blocks are. A reload that
// removes the provider ends its subscription and its series once the old snapshot drained.
func TestReloadKeepsKVStream(t *testing.T) {
	engines, gw := preciseFleet(t, 2, true, nil)
	msgs := longConversation("reload")
	ids := tokenize(t, engines[0], msgs)
	home := waitPinned(t, gw, msgs, ids)
	src := gw.g.Snapshot().kv[home]
	before := src.st.Stats()
	mustReload(t, gw, preciseConfig(engines, true, "threshold = 0.4"))
	after := gw.g.Snapshot().kv[home]
	if after != src {
		t.Fatal("the reload replaced the KV-event source of an unchanged provider")
	}
	st := after.st.Stats()
	if !st.Trusted || st.ReplaysOK != before.ReplaysOK || st.Restarts != before.Restarts || st.Blocks != before.Blocks {
		t.Fatalf("stream after the reload %+v, before %+v: want trusted, no replay, same blocks", st, before)
	}
	if target, decision := preciseTurn(t, gw, msgs, ids); target != home || decision != "prefix_hit" {
		t.Fatalf("after the reload the ids went to %s (%s), want %s (prefix_hit)", target, decision, home)
	}
	other := "sim-0"
	if home == "sim-0" {
		other = "sim-1"
	}
	removed := gw.g.Snapshot().kv[other]
	mustReload(t, gw, dropProvider(preciseConfig(engines, true, ""), other))
	waitSettled(t, gw)
	if removed.holds != 0 || gw.g.kv.used[removed.id] {
		t.Fatalf("the removed provider's source is still live (holds %d)", removed.holds)
	}
	if m := metricsText(t, gw); strings.Contains(m, `rolter_kv_stream_trusted{target="`+other+`"}`) {
		t.Fatalf("the removed provider's KV series are still exported:\n%s", grepLines(m, other))
	}
}

// dropProvider removes provider name and its route target from a config rendered by preciseConfig.
func dropProvider(text, name string) string {
	var out []string
	blocks := strings.Split(text, "[[")
	for i, b := range blocks {
		if i > 0 && strings.Contains(b, "\""+name+"\"") {
			continue
		}
		if i > 0 {
			b = "[[" + b
		}
		out = append(out, b)
	}
	return strings.Join(out, "")
}

// TestBindModeAllowedPublishers: with kv_events in bind mode, a publisher from an allowed address is
// ingested and one from an address not on allowed_publishers is refused and counted.
func TestBindModeAllowedPublishers(t *testing.T) {
	f := func(allowed string, wantIngested bool) {
		t.Helper()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		endpoint := "tcp://" + ln.Addr().String()
		ln.Close()
		engines, _ := simFleet(t, 1, func(c *sim.Config) { c.KVEvents = endpoint })
		policy := ""
		if allowed != "" {
			policy = fmt.Sprintf("allowed_publishers = [%q]", allowed)
		}
		cfg := fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[providers]]
name = "sim-0"
api_base = %q
[providers.kv_events]
endpoint = %q
mode = "bind"
stale_secs = 60
%s
[[routes]]
model = "m"
strategy = "precise_cache_aware"
[[routes.targets]]
provider = "sim-0"
model = "sim-model"
`, engines[0].URL(), endpoint, policy)
		gw := startGateway(t, cfg)
		src := gw.g.Snapshot().kv["sim-0"]
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; time.Now().Before(deadline); i++ {
			// A new prompt each turn: a publisher whose first events went out before it was connected
			// (ZMQ's slow joiner) publishes again.
			msgs := longConversation(fmt.Sprintf("bind %s %d", allowed, i))
			preciseTurn(t, gw, msgs, tokenize(t, engines[0], msgs))
			st := src.st.Stats()
			if wantIngested && st.StoredEvents > 0 {
				return
			}
			if !wantIngested && st.AuthRefused > 0 {
				if st.StoredEvents != 0 {
					t.Fatalf("a refused publisher's events were ingested: %+v", st)
				}
				if m := metricsText(t, gw); !strings.Contains(m, `rolter_kv_stream_total{target="sim-0",event="auth_refused"}`) {
					t.Fatalf("refusals not exported:\n%s", grepLines(m, "auth_refused"))
				}
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("allowed_publishers %q: stats %+v, want ingested=%v", allowed, src.st.Stats(), wantIngested)
	}
	f("", true)
	f("127.0.0.1", true)
	f("10.9.9.9/32", false)
}

func TestParseTokenIDs(t *testing.T) {
	f := func(in string, want []uint32, ok bool) {
		t.Helper()
		got, gotOK := parseTokenIDs(nil, []byte(in))
		if gotOK != ok || (ok && fmt.Sprint(got) != fmt.Sprint(want)) {
			t.Fatalf("parseTokenIDs(%q) = %v, %v; want %v, %v", in, got, gotOK, want, ok)
		}
	}
	f("1,2,3", []uint32{1, 2, 3}, true)
	f("0", []uint32{0}, true)
	f("4294967295", []uint32{4294967295}, true)
	f("4294967296", nil, false)
	f("99999999999999999999999", nil, false)
	f("", nil, false)
	f("1,", nil, false)
	f(",1", nil, false)
	f("1,,2", nil, false)
	f("1, 2", nil, false)
	f("-1", nil, false)
	f("+1", nil, false)
	f("1;2", nil, false)
	f("0x10", nil, false)
}

// TestPreciseWeighsHolders: among the engines holding a prompt's blocks, the resident share is weighed
// against the load as pipeline weighs it: at equal loads the whole-prompt holder wins; once it is busier, the
// engine holding three quarters of the prompt takes it, not a cold one.
func TestPreciseWeighsHolders(t *testing.T) {
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	r := preciseRoute(t, 4, tokens) // target i holds the first (i+1)/4 of the prompt
	var buf, out [maxTargets]int
	var kvOut [kvindex.MaxTargets]int
	var scratch kvindex.Scratch
	var matches [maxTargets]int32
	var p Pick
	allEligible(r, &p, buf[:])
	p.TokenIDs, p.TokenIDsState, p.kvScratch, p.kvOut, p.Matches = tokens, tokenIDsOK, &scratch, kvOut[:], matches[:4]
	for _, c := range []struct {
		load int64
		want int
	}{{1, 3}, {4, 2}} {
		// The whole prompt's holder with c.load in flight, one request on each other engine.
		for i, tg := range r.Targets {
			tg.Provider.inflight.Store(1)
			if i == 3 {
				tg.Provider.inflight.Store(c.load)
			}
		}
		if _, d := r.rank(&p, out[:]); out[0] != c.want || d.Reason != ReasonPrefixHit {
			t.Fatalf("holder at %d in flight: %d (%s), want %d (prefix_hit)", c.load, out[0], d.Reason, c.want)
		}
	}
}
