package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// chatTokens tokenizes a plan request as the sim does.
func chatTokens(r loadtest.Request) []uint32 {
	var msgs [][2][]byte
	for _, m := range r.Messages {
		msgs = append(msgs, [2][]byte{[]byte(m.Role), []byte(m.Content)})
	}
	return sim.AppendChatTokens(nil, msgs, true)
}

func commonPrefix[T comparable](a, b []T) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestTracePlanPrefixSharing: two requests sharing their first k blocks get prompts that share
// exactly the first k chunks (plus the template's 3 header tokens) and differ from the next
// token on, in both formats; a block hash reused after a different parent is not shared.
func TestTracePlanPrefixSharing(t *testing.T) {
	moon := func(ids ...uint64) capture.Request {
		return capture.Request{Len: 512*len(ids) - 100, BlockLen: capture.MooncakeBlockTokens, InTokens: 512*len(ids) - 100,
			OutTokens: 4, Cached: -1, Blocks: ids}
	}
	ours := func(ids ...uint64) capture.Request {
		return capture.Request{Len: 256*len(ids) - 30, BlockLen: 256, InTokens: 64*len(ids) - 2, OutTokens: 4, Cached: -1, Blocks: ids}
	}
	f := func(unit string, a, b capture.Request, wantShared int) {
		t.Helper()
		tr := &capture.Trace{Format: capture.FormatRolter, Unit: unit, Requests: []capture.Request{a, b}}
		if unit == capture.UnitTokens {
			tr.Format = capture.FormatMooncake
		}
		plan, st, err := TracePlan(tr, PlanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ta, tb := chatTokens(plan.Requests[0]), chatTokens(plan.Requests[1])
		// The template's header <im_start> "user" <role_end> is shared by every prompt.
		shared := int(math.Round(float64(wantShared) * st.BlockTokens))
		if want := 3 + shared; commonPrefix(ta, tb) != want {
			t.Fatalf("%s %v / %v: prompts share %d tokens, want %d (blocks of %.2f tokens)", unit, a.Blocks, b.Blocks, commonPrefix(ta, tb), want, st.BlockTokens)
		}
		ca, cb := plan.Requests[0].Messages[0].Content, plan.Requests[1].Messages[0].Content
		if got, wantBytes := commonPrefix([]byte(ca), []byte(cb)), 4*shared; got < wantBytes || got > wantBytes+3 {
			t.Fatalf("%s: texts share %d bytes, want %d (+ at most 3 letters of the next word)", unit, got, wantBytes)
		}
		for i, r := range []capture.Request{a, b} {
			want := r.InTokens + TemplateTokens // Mooncake: input_length content tokens
			if unit == capture.UnitBytes {
				want = r.InTokens // ours: the live prompt_tokens
			}
			if got := len(chatTokens(plan.Requests[i])); got != want {
				t.Fatalf("%s request %d: %d prompt tokens, want %d", unit, i, got, want)
			}
		}
	}
	for _, c := range []struct {
		unit string
		mk   func(...uint64) capture.Request
	}{{capture.UnitTokens, moon}, {capture.UnitBytes, ours}} {
		f(c.unit, c.mk(1, 2, 3), c.mk(4, 5, 6), 0)
		f(c.unit, c.mk(1, 2, 3), c.mk(1, 5, 6), 1)
		f(c.unit, c.mk(1, 2, 3), c.mk(1, 2, 6), 2)
		f(c.unit, c.mk(1, 2, 3, 4), c.mk(1, 2, 3, 7, 8), 3)
		f(c.unit, c.mk(1, 2, 3), c.mk(9, 2, 3), 0) // 2 and 3 after another parent are other blocks
		f(c.unit, c.mk(1, 2), c.mk(1, 1, 2), 1)
	}
}

// TestTracePlanSizes: a Mooncake request's last block is trimmed to input_length and is a prefix
// of the same block's full text; a capture's request with "in" gets exactly in prompt tokens,
// one without converts its bytes; scale divides everything.
func TestTracePlanSizes(t *testing.T) {
	tr := &capture.Trace{Format: capture.FormatMooncake, Unit: capture.UnitTokens, Requests: []capture.Request{
		{Len: 1024, BlockLen: 512, InTokens: 1024, OutTokens: 7, Blocks: []uint64{1, 2}},
		{Len: 600, BlockLen: 512, InTokens: 600, OutTokens: 0, Blocks: []uint64{1, 2}},   // trimmed to 88 tokens of block 2
		{Len: 1600, BlockLen: 512, InTokens: 1600, OutTokens: 3, Blocks: []uint64{1, 2}}, // 576 tokens past the blocks
	}}
	plan, _, err := TracePlan(tr, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0, t1, t2 := chatTokens(plan.Requests[0]), chatTokens(plan.Requests[1]), chatTokens(plan.Requests[2])
	if len(t0) != 1024+9 || len(t1) != 600+9 || len(t2) != 1600+9 {
		t.Fatalf("prompt tokens %d, %d, %d", len(t0), len(t1), len(t2))
	}
	if n := commonPrefix(t0, t1); n != 3+600 {
		t.Fatalf("the trimmed block shares %d tokens with the full one, want %d", n, 3+600)
	}
	if n := commonPrefix(t0, t2); n != 3+1024 {
		t.Fatalf("the longer prompt shares %d tokens, want %d", n, 3+1024)
	}
	if m := []int{plan.Requests[0].MaxTokens, plan.Requests[1].MaxTokens}; m[0] != 7 || m[1] != DefaultOutputTokens {
		t.Fatalf("max_tokens %v", m)
	}
	plan, st, err := TracePlan(tr, PlanOptions{Scale: 4})
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockTokens != 128 || len(chatTokens(plan.Requests[1])) != 150+9 || plan.Requests[0].MaxTokens != 2 {
		t.Fatalf("scale 4: block %v tokens, prompt %d, max_tokens %d", st.BlockTokens, len(chatTokens(plan.Requests[1])), plan.Requests[0].MaxTokens)
	}

	// A capture: 0.25 tokens per byte from the lines with "in"; the line without converts.
	tr = &capture.Trace{Format: capture.FormatRolter, Unit: capture.UnitBytes, Requests: []capture.Request{
		{Len: 1000, BlockLen: 256, InTokens: 250, Blocks: []uint64{1, 2, 3, 4}, Cached: -1},
		{Len: 600, BlockLen: 256, Blocks: []uint64{1, 2, 5}, Cached: -1},
		{Len: 0, BlockLen: 256, InTokens: 20, Cached: -1},
	}}
	plan, st, err = TracePlan(tr, PlanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.BlockTokens != 64 || st.TokensPerByte != 0.25 {
		t.Fatalf("block %v tokens at %v tokens per byte", st.BlockTokens, st.TokensPerByte)
	}
	if got := []int{len(chatTokens(plan.Requests[0])), len(chatTokens(plan.Requests[1])), len(chatTokens(plan.Requests[2]))}; got[0] != 250 || got[1] != 150+9 || got[2] != 20 {
		t.Fatalf("prompt tokens %v, want 250, 159, 20", got)
	}
}

// TestTracePlanSessions: a session's requests wait on the previous one, times follow speed,
// unanswered and too long requests are skipped.
func TestTracePlanSessions(t *testing.T) {
	req := func(at float64, session string, status int, blocks ...uint64) capture.Request {
		return capture.Request{Time: at, Len: 256 * len(blocks), BlockLen: 256, InTokens: 64 * len(blocks), Cached: 10, Session: session,
			Status: status, Blocks: blocks}
	}
	tr := &capture.Trace{Format: capture.FormatRolter, Unit: capture.UnitBytes, Requests: []capture.Request{
		req(0, "a", 200, 1),
		req(1, "b", 200, 2),
		req(2, "a", 503, 1, 3),
		req(3, "a", 200, 1, 3, 4),
		req(4, "", 200, 5),
		req(5, "b", 200, 2, 6),
		req(6, "c", 200, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17), // 704 tokens: over max_model_len
	}}
	plan, st, err := TracePlan(tr, PlanOptions{Speed: 2, MaxModelLen: 700})
	if err != nil {
		t.Fatal(err)
	}
	if st.Planned != 5 || st.Skipped[SkipUnanswered] != 1 || st.Skipped[SkipTooLong] != 1 || st.Sessions != 2 {
		t.Fatalf("stats %+v", st)
	}
	var after []int
	var at []time.Duration
	var sessions []string
	for _, r := range plan.Requests {
		after, at, sessions = append(after, r.After), append(at, r.At), append(sessions, r.Session)
	}
	if fmt.Sprint(after) != "[0 0 1 0 2]" || fmt.Sprint(sessions) != "[a b a  b]" || !plan.Timed ||
		fmt.Sprint(at) != "[0s 500ms 1.5s 2s 2.5s]" {
		t.Fatalf("after %v, sessions %q, at %v, timed %v", after, sessions, at, plan.Timed)
	}
	if st.LiveRequests != 5 || math.Abs(st.LiveHitRate-50.0/(64*8)) > 1e-9 {
		t.Fatalf("live %d requests, hit rate %v", st.LiveRequests, st.LiveHitRate)
	}
	if _, _, err := TracePlan(&capture.Trace{}, PlanOptions{}); err == nil {
		t.Fatal("an empty trace was planned")
	}
}

// TestReplayMooncake replays a Mooncake-format trace end to end on a small fleet: every request
// answered under every strategy, the engines' counters consistent, the prompts' prefix sharing
// visible to a cache-aware strategy.
func TestReplayMooncake(t *testing.T) {
	f, err := os.Open("../../capture/testdata/mooncake.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := capture.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	// Repeat the file's requests a few times, so the shared blocks are reused.
	base := tr.Requests
	tr.Requests = nil
	for r := 0; r < 4; r++ {
		for _, q := range base {
			q.Time += float64(r) * 10
			tr.Requests = append(tr.Requests, q)
		}
	}
	var log bytes.Buffer
	rep, err := Run(context.Background(), "mooncake.jsonl", &tr, Options{
		Engines: 2, Strategies: []string{"round_robin", "cache_aware", "no_such_strategy"}, KVBlocks: 256, MaxNumSeqs: 2,
		PrefillPerToken: 10 * time.Microsecond, DecodePerToken: 50 * time.Microsecond, Scale: 8, Timeout: time.Minute, Log: &log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Plan.Planned != len(tr.Requests) || rep.Format != capture.FormatMooncake || len(rep.Runs) != 3 {
		t.Fatalf("planned %d of %d, format %q, %d runs", rep.Plan.Planned, len(tr.Requests), rep.Format, len(rep.Runs))
	}
	hit := map[string]float64{}
	for _, r := range rep.Runs {
		if r.Strategy == "no_such_strategy" {
			if !strings.Contains(r.Unavailable, "not available in this build") {
				t.Fatalf("unknown strategy: %+v", r)
			}
			continue
		}
		if !r.Available() || r.Succeeded != rep.Plan.Planned || r.Failed+r.Cancelled != 0 {
			t.Fatalf("%s: %+v\n%s", r.Strategy, r, log.String())
		}
		if r.PromptTokens != uint64(rep.Plan.PromptTokens) || len(r.EngineRequests) != 2 || r.TTFT.N != r.Succeeded {
			t.Fatalf("%s: engines saw %d prompt tokens, planned %d; %v; ttft %+v", r.Strategy, r.PromptTokens, rep.Plan.PromptTokens,
				r.EngineRequests, r.TTFT)
		}
		if r.HitRate > r.OracleHitRate+1e-9 || r.OracleHitRate <= 0 || r.CapacityOracleHitRate > r.OracleHitRate+1e-9 {
			t.Fatalf("%s: hit %.3f, oracle %.3f, capacity oracle %.3f", r.Strategy, r.HitRate, r.OracleHitRate, r.CapacityOracleHitRate)
		}
		hit[r.Strategy] = r.HitRate
	}
	if hit["cache_aware"] <= hit["round_robin"] {
		t.Fatalf("cache_aware hit %.3f <= round_robin's %.3f", hit["cache_aware"], hit["round_robin"])
	}
	md := rep.Markdown()
	for _, want := range []string{"Mooncake trace", "| cache_aware | ", "| no_such_strategy | not available in this build", "÷ capacity oracle"} {
		if !strings.Contains(md, want) {
			t.Fatalf("the table lacks %q:\n%s", want, md)
		}
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil || !json.Valid(js.Bytes()) {
		t.Fatalf("json: %v", err)
	}
}

// promptKey is the gateway's prompt key of a chat prompt (docs/architecture.md, "Prompt key").
func promptKey(msgs []loadtest.Message) []byte {
	var k []byte
	for _, m := range msgs {
		k = append(k, m.Role...)
		k = append(k, 0x1f)
		k = append(k, m.Content...)
		k = append(k, 0x1e)
	}
	return k
}

// captureOf writes the capture lines the gateway would have written for samples (package
// capture's format: salted chained block hashes of the prompt key, hashed session), in the
// order the requests ended, as the gateway writes them.
func captureOf(t *testing.T, samples []loadtest.Sample, salt uint64, blockBytes int, sessions bool) []byte {
	t.Helper()
	sort.Slice(samples, func(i, j int) bool {
		return samples[i].StartMs+samples[i].LatencyMs < samples[j].StartMs+samples[j].LatencyMs
	})
	var out bytes.Buffer
	for _, s := range samples {
		key := promptKey(s.Prompt)
		rec := capture.Record{TS: 1.7645e9 + s.StartMs/1000, Route: "sim-model", InBytes: len(key), BlockBytes: blockBytes,
			Blocks: []string{}, Target: s.Target, Decision: s.Decision, Score: -1, Status: s.Status}
		if s.Error == "" {
			cached := s.CachedTokens
			rec.In, rec.Out, rec.Cached = s.PromptTokens, s.OutputTokens, &cached
		}
		var prev uint64
		for off := 0; off < len(key); off += blockBytes {
			prev = capture.ChainHash(salt, prev, key[off:min(off+blockBytes, len(key))])
			rec.Blocks = append(rec.Blocks, fmt.Sprintf("%016x", prev))
		}
		if sessions {
			rec.Session = fmt.Sprintf("%016x", capture.ChainHash(salt, 0, []byte(fmt.Sprint("user-", s.Group))))
		}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(append(line, '\n'))
		if bytes.Contains(line, []byte(s.Prompt[len(s.Prompt)-1].Content[:12])) {
			t.Fatalf("a capture line holds prompt text: %s", line)
		}
	}
	return out.Bytes()
}

// TestReplayReproducesLive checks that a live workload through a real gateway,
// captured, then replayed from the capture alone, gives the live run's cache_aware hit rate
// within 5 points, for shared prefixes and for multi-turn sessions (whose check fails, 7 to 10
// points low, without PlanOptions' continuation of partial blocks). The fleet is sized so that
// the live runs themselves agree from run to run: with a third of these KV blocks, two live runs
// of the same workload already differ by up to 7 points (multi-turn is then bimodal: thrashing
// or not), and one run cannot be reproduced closer than another run of itself.
func TestReplayReproducesLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a live fleet and a replay")
	}
	f := func(w loadtest.Workload, kvBlocks, blockBytes int, sessions bool) {
		t.Helper()
		opts := Options{Engines: 4, KVBlocks: kvBlocks, MaxNumSeqs: 3, Concurrency: 4,
			PrefillPerToken: 20 * time.Microsecond, DecodePerToken: 200 * time.Microsecond, Strategies: []string{"cache_aware"},
			Timeout: time.Minute}
		opts.normalize()
		var extra []string
		tracePath := filepath.Join(t.TempDir(), "trace.jsonl")
		if blockBytes < 0 {
			// The gateway writes the capture.
			extra = append(extra, fmt.Sprintf("[trace]\npath = %q\n", tracePath))
		}
		fl, err := fleet.Start(opts.Engines, opts.simConfig(), "cache_aware", discardLogger(), extra...)
		if err != nil {
			t.Fatal(err)
		}
		live, err := loadtest.Run(context.Background(), loadtest.Options{URL: fl.URL, Workload: w, Concurrency: opts.Concurrency,
			Duration: time.Minute, Targets: fl.Names, KeepSamples: true})
		fl.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if live.Succeeded != live.Planned {
			t.Fatalf("live %s: %d of %d ok: %v", w.Scenario, live.Succeeded, live.Planned, live.Errors)
		}
		var lines []byte
		if blockBytes < 0 {
			// The gateway's writer has closed its file: fl.stop shut the gateway down.
			if lines, err = os.ReadFile(tracePath); err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(lines, []byte("\n")); n != live.Planned {
				t.Fatalf("the gateway captured %d lines for %d requests", n, live.Planned)
			}
		} else {
			lines = captureOf(t, live.Samples, 0x5a17, blockBytes, sessions)
		}
		tr, err := capture.Read(bytes.NewReader(lines))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := runTrace(context.Background(), "live.jsonl", &tr, opts, true)
		if err != nil {
			t.Fatal(err)
		}
		run := rep.Runs[0]
		if !run.Available() || run.Succeeded != live.Succeeded {
			t.Fatalf("replay %s: %+v", w.Scenario, run)
		}
		t.Logf("%s: live hit %.3f (oracle %.3f, %d prompt tokens), replayed %.3f (oracle %.3f, %d prompt tokens); capture says %.3f",
			w.Scenario, live.HitRate, live.OracleHitRate, live.PromptTokens, run.HitRate, run.OracleHitRate, run.PromptTokens, rep.Plan.LiveHitRate)
		if math.Abs(run.HitRate-live.HitRate) > 0.05 {
			t.Fatalf("%s: replayed hit rate %.3f, live %.3f: more than 5 points apart", w.Scenario, run.HitRate, live.HitRate)
		}
		if math.Abs(rep.Plan.LiveHitRate-live.HitRate) > 1e-9 {
			t.Fatalf("the capture's own hit rate %.4f is not the live run's %.4f", rep.Plan.LiveHitRate, live.HitRate)
		}
	}
	f(loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: 3, Groups: 16, PromptsPerGroup: 24, Popularity: loadtest.Uniform,
		SystemTokens: 256, QuestionTokens: 32, OutputTokens: 8}, 256, capture.DefaultBlockBytes, false)
	// The same, captured by the gateway itself ([trace]), not written by the test.
	f(loadtest.Workload{Scenario: loadtest.SharedPrefix, Seed: 4, Groups: 16, PromptsPerGroup: 24, Popularity: loadtest.Uniform,
		SystemTokens: 256, QuestionTokens: 32, OutputTokens: 8}, 256, -1, false)
	f(loadtest.Workload{Scenario: loadtest.MultiTurn, Seed: 3, Users: 16, Rounds: 6, SystemTokens: 128, HistoryTokens: 64,
		QuestionTokens: 24, OutputTokens: 24}, 256, capture.DefaultBlockBytes, true)
}

// TestReplayTimeout: the timeout bounds the whole replay; what did not finish is counted.
func TestReplayTimeout(t *testing.T) {
	var reqs []capture.Request
	for i := 0; i < 40; i++ {
		reqs = append(reqs, capture.Request{Time: float64(i), Len: 64, BlockLen: capture.MooncakeBlockTokens, InTokens: 64, OutTokens: 30,
			Cached: -1, Blocks: []uint64{uint64(i % 3)}})
	}
	tr := &capture.Trace{Format: capture.FormatMooncake, Unit: capture.UnitTokens, Requests: reqs}
	o := Options{Engines: 1, Strategies: []string{"round_robin"}, KVBlocks: 64, MaxNumSeqs: 1, Concurrency: 1,
		DecodePerToken: 10 * time.Millisecond, Timeout: 3 * time.Second} // 40 requests of 300ms: 12s unbounded
	start := time.Now()
	rep, err := Run(context.Background(), "slow", tr, o)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Fatalf("the replay took %s with a timeout of 3s", d)
	}
	r := rep.Runs[0]
	if !r.Available() || r.Planned != 40 || r.Sent >= 40 || r.Succeeded == 0 {
		t.Fatalf("run %+v", r)
	}
	if md := rep.Markdown(); !strings.Contains(md, "not sent before the timeout") {
		t.Fatalf("the table does not say the run was cut:\n%s", md)
	}
	o.Strategies = []string{"a", "b"}
	if _, err := Run(context.Background(), "slow", tr, o); err == nil || !strings.Contains(err.Error(), "too short for 2 strategies") {
		t.Fatalf("got %v", err)
	}
}
