package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/sim"
)

// scanAll feeds body to a fresh scan in pieces of n bytes (n <= 0: whole).
func scanAll(body string, n int) *usageScan {
	s := &usageScan{}
	b := []byte(body)
	if n <= 0 {
		n = len(b)
	}
	for len(b) > 0 {
		k := min(n, len(b))
		s.feed(b[:k])
		b = b[k:]
	}
	return s
}

func TestUsageScan(t *testing.T) {
	sse := `data: {"id":"x","choices":[{"delta":{"content":"the \"usage\": {\"prompt_tokens\":999} trick"}}],"usage":null}` + "\n\n" +
		`data: {"id":"x","choices":[{"delta":{"content":"usage"}}],"usage":null}` + "\n\n" +
		`data: {"id":"x","choices":[],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}` + "\n\n" +
		"data: [DONE]\n\n"
	cases := []struct {
		name                        string
		body                        string
		found, hasCached            bool
		prompt, cached, completions int64
	}{
		{"sse with a usage chunk", sse, true, true, 120, 96, 10},
		{"json", `{"id":"c","object":"chat.completion","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}`, true, true, 7, 0, 2},
		{"python separators", `{"choices": [], "usage" : { "prompt_tokens": 33, "prompt_tokens_details": {"cached_tokens": 16} } }`, true, true, 33, 16, 0},
		{"no details (SGLang, vLLM without --enable-prompt-tokens-details)", `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`, true, false, 5, 0, 1},
		{"sse without usage", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", false, false, 0, 0, 0},
		{"usage as a string value", `{"object":"usage","note":"usage"}`, false, false, 0, 0, 0},
		{"escaped key in content", `{"content":"\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":5}}"}`, false, false, 0, 0, 0},
		{"continuous usage: the last wins", `data: {"usage":{"prompt_tokens":50,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n" +
			`data: {"usage":{"prompt_tokens":50,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n", true, true, 50, 32, 2},
		{"cached above prompt is not a measurement", `{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":9}}}`, true, false, 5, 0, 0},
		{"negative or fractional counts", `{"usage":{"prompt_tokens":-5,"prompt_tokens_details":{"cached_tokens":1}}}`, false, false, 0, 0, 0},
		{"too long an object", `{"usage":{"prompt_tokens":5,"pad":"` + strings.Repeat("x", 2*maxUsageBytes) + `"}}`, false, false, 0, 0, 0},
		{"truncated", `{"usage":{"prompt_tokens":5,"prompt_tokens_d`, false, false, 0, 0, 0},
		{"long keys with escapes", `{"usage":{"a long key, with \"quotes\" and a \\ inside":"and a long \"value\" too","prompt_tokens":5,"completion_tokens":1}}`, true, false, 5, 0, 1},
		{"a control character deep in a key", "{\"usage\":{\"prompt_tokens\":5,\"a long key with a \x01 in it\":1}}", false, false, 0, 0, 0},
	}
	for _, tc := range cases {
		for _, n := range []int{0, 1, 2, 3, 5, 7, 8, 13, 64} {
			s := scanAll(tc.body, n)
			if s.found != tc.found || s.hasCached != tc.hasCached || (s.found && (s.prompt != tc.prompt || s.completed != tc.completions)) ||
				(s.hasCached && s.cached != tc.cached) {
				t.Errorf("%s, pieces of %d: found %v cached %v prompt %d cached %d completion %d; want %v %v %d %d %d", tc.name, n,
					s.found, s.hasCached, s.prompt, s.cached, s.completed, tc.found, tc.hasCached, tc.prompt, tc.cached, tc.completions)
			}
		}
	}
	// A split key at every position of a stream.
	for cut := 0; cut <= len(sse); cut++ {
		s := &usageScan{}
		s.feed([]byte(sse[:cut]))
		s.feed([]byte(sse[cut:]))
		if !s.found || s.prompt != 120 || s.cached != 96 {
			t.Fatalf("cut at %d: found %v prompt %d cached %d", cut, s.found, s.prompt, s.cached)
		}
	}
}

func TestUsageScanAllocs(t *testing.T) {
	body := []byte(`data: {"id":"x","choices":[],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}` + "\n\n")
	s := &usageScan{}
	s.feed(body) // warms the parser
	if n := testing.AllocsPerRun(100, func() {
		s.reset()
		s.feed(body[:40])
		s.feed(body[40:])
	}); n != 0 {
		t.Fatalf("%v allocations per scanned response, want 0", n)
	}
}

func BenchmarkUsageScan(b *testing.B) {
	// A 64-event stream, as the client gets it: every event searched, one usage object parsed.
	var sb strings.Builder
	for i := range 64 {
		fmt.Fprintf(&sb, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok%d "}}],"usage":null}`+"\n\n", i)
	}
	sb.WriteString(`data: {"id":"x","choices":[],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}` + "\n\ndata: [DONE]\n\n")
	var events [][]byte
	for _, e := range strings.SplitAfter(sb.String(), "\n\n") {
		events = append(events, []byte(e))
	}
	s := &usageScan{}
	b.SetBytes(int64(sb.Len()))
	b.ReportAllocs()
	for b.Loop() {
		s.reset()
		for _, e := range events {
			s.feed(e)
		}
	}
}

// TestDeliveredReuseMatchesEngines: the gateway's delivered counters equal the
// simulated engines' own counts of queried and cached prompt tokens, for JSON answers and for streams
// with a usage chunk; streams without one are counted as unmeasured.
func TestDeliveredReuseMatchesEngines(t *testing.T) {
	engines, urls := simFleet(t, 3, nil)
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", "", urls...), "up-model", sim.DefaultConfig().Model))
	system := strings.Repeat("You answer questions about the fleet. ", 40)
	send := func(i int, stream, usage bool) {
		body := map[string]any{"model": "m", "max_tokens": 3,
			"messages": []chatMsg{{Role: "system", Content: system + fmt.Sprint(i%4)}, {Role: "user", Content: fmt.Sprint("question ", i)}}}
		if stream {
			body["stream"] = true
			if usage {
				body["stream_options"] = map[string]bool{"include_usage": true}
			}
		}
		b, _ := json.Marshal(body)
		resp, got := post(t, gw.URL+"/v1/chat/completions", string(b))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	for i := range 24 {
		send(i, i%2 == 1, true)
	}
	_, text := getMetrics(t, gw)
	var prompt, cached, measured float64
	for i, e := range engines {
		l := fmt.Sprintf(`{route="m",target="p%d"}`, i)
		st := e.Stats()
		gp, gc := metricValue(text, "rolter_prompt_tokens_total"+l), metricValue(text, "rolter_cached_tokens_total"+l)
		if gp != float64(st.QueriedTokens) || gc != float64(st.HitTokens) {
			t.Errorf("p%d: gateway counted %v prompt / %v cached tokens; the engine %d / %d", i, gp, gc, st.QueriedTokens, st.HitTokens)
		}
		prompt += gp
		cached += gc
		measured += metricValue(text, fmt.Sprintf(`rolter_usage_responses_total{route="m",target="p%d",usage="measured"}`, i))
		// held >= captured, and both within the scored prompt sizes.
		sc := metricValue(text, "rolter_reuse_scored_total"+l)
		h, c := metricValue(text, "rolter_reuse_held_total"+l), metricValue(text, "rolter_reuse_captured_total"+l)
		if h < c || h > sc || c < 0 {
			t.Errorf("p%d: held %v captured %v scored %v", i, h, c, sc)
		}
	}
	if measured != 24 || cached == 0 || prompt == 0 {
		t.Fatalf("measured %v requests, %v cached of %v prompt tokens; want 24 measured and some reuse", measured, cached, prompt)
	}
	// Streams without stream_options.include_usage carry no usage: unmeasured, and no tokens counted.
	for i := range 4 {
		send(100+i, true, false)
	}
	_, text = getMetrics(t, gw)
	var unmeasured, prompt2 float64
	for i := range engines {
		unmeasured += metricValue(text, fmt.Sprintf(`rolter_usage_responses_total{route="m",target="p%d",usage="unmeasured"}`, i))
		prompt2 += metricValue(text, fmt.Sprintf(`rolter_prompt_tokens_total{route="m",target="p%d"}`, i))
	}
	if unmeasured != 4 || prompt2 != prompt {
		t.Fatalf("after 4 streams without usage: %v unmeasured, prompt tokens %v -> %v", unmeasured, prompt, prompt2)
	}
	if !strings.Contains(text, `rolter_reuse_gap_ratio{route="m",target="p0"}`) {
		t.Fatal("no rolter_reuse_gap_ratio series")
	}
}

// TestDeliveredReuseFraming reads usage from bodies in every framing: Content-Length, chunked with the
// usage object split between chunks, and an SSE stream whose usage event arrives in pieces.
func TestDeliveredReuseFraming(t *testing.T) {
	const usage = `"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}`
	jsonBody := `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],` + usage + `}`
	sseBody := "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}],\"usage\":null}\n\ndata: {\"choices\":[]," + usage + "}\n\ndata: [DONE]\n\n"
	pieces := func(w http.ResponseWriter, body string, n int) {
		f := w.(http.Flusher)
		for len(body) > 0 {
			k := min(n, len(body))
			io.WriteString(w, body[:k])
			f.Flush()
			body = body[k:]
		}
	}
	cases := map[string]http.HandlerFunc{
		"content-length": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", fmt.Sprint(len(jsonBody)))
			io.WriteString(w, jsonBody)
		},
		"chunked": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			pieces(w, jsonBody, 9)
		},
		"sse": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			pieces(w, sseBody, 11)
		},
	}
	for name, h := range cases {
		t.Run(name, func(t *testing.T) {
			up := newFakeUpstream(t, h)
			gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
			for range 3 {
				resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", name == "sse"))
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, got)
				}
			}
			_, text := getMetrics(t, gw)
			l := `{route="m",target="p0"}`
			if p, c := metricValue(text, "rolter_prompt_tokens_total"+l), metricValue(text, "rolter_cached_tokens_total"+l); p != 120 || c != 96 {
				t.Fatalf("prompt %v cached %v, want 120 and 96", p, c)
			}
			// round_robin predicts nothing: no predicted reuse is counted, and the gap stays unknown.
			if s := metricValue(text, "rolter_reuse_scored_total"+l); s != 0 {
				t.Fatalf("round_robin scored %v", s)
			}
			if g := metricValue(text, "rolter_reuse_gap_ratio"+l); !math.IsNaN(g) {
				t.Fatalf("gap %v for a strategy that predicts nothing, want NaN", g)
			}
		})
	}
}

// usageReference reads a JSON object body's top-level usage with encoding/json: the counts the scan must
// find for a body that is one JSON object with one "usage" key in all.
func usageReference(body []byte) (found, hasCached bool, prompt, cached, completed int64, ok bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return false, false, 0, 0, 0, false
	}
	raw, present := top["usage"]
	if !present {
		return false, false, 0, 0, 0, true
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil || len(raw) > maxUsageBytes {
		return false, false, 0, 0, 0, true
	}
	count := func(m map[string]json.RawMessage, k string) (int64, bool) {
		var f float64
		v, has := m[k]
		if !has || len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) { // null, a string, ...
			return 0, false
		}
		if json.Unmarshal(v, &f) != nil || f < 0 || f != math.Trunc(f) || f > 1<<53 {
			return 0, false
		}
		return int64(f), true
	}
	p, has := count(u, "prompt_tokens")
	if !has {
		return false, false, 0, 0, 0, true
	}
	c, _ := count(u, "completion_tokens")
	var d map[string]json.RawMessage
	var k int64
	hasK := false
	if json.Unmarshal(u["prompt_tokens_details"], &d) == nil && d != nil {
		k, hasK = count(d, "cached_tokens")
	}
	return true, hasK && k <= p, p, k, c, true
}

// FuzzUsageScan checks the scan against encoding/json on bodies that are one JSON object, whole and in
// pieces: what the in-place read and the copying read find must agree with each other and with it.
func FuzzUsageScan(f *testing.F) {
	for _, s := range []string{
		`{"usage":{"prompt_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":3}}}`,
		`{"choices": [], "usage" : { "prompt_tokens": 33, "prompt_tokens_details": {"cached_tokens": 16} } }`,
		`{"usage":{"prompt_tokens":5.0,"completion_tokens":1e1,"prompt_tokens_details":null}}`,
		`{"usage":{"prompt_tokens":-5,"x":[1,{"a":"\"}"}],"prompt_tokens_details":{"cached_tokens":1}}}`,
		`{"usage":{"prompt_tokens":9007199254740993,"prompt_tokens_details":{"cached_tokens":true}}}`,
		`{"usage":null,"id":"x"}`,
	} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, body []byte, piece uint8) {
		if bytes.Count(body, []byte(`"usage"`)) != 1 {
			return
		}
		found, hasCached, prompt, cached, completed, ok := usageReference(body)
		if !ok {
			return
		}
		for _, n := range []int{0, int(piece%16) + 1} {
			s := scanAll(string(body), n)
			if s.found != found || (found && (s.prompt != prompt || s.completed != completed || s.hasCached != hasCached)) ||
				(hasCached && s.cached != cached) {
				t.Fatalf("%q in pieces of %d: found %v prompt %d completion %d cached %v %d; encoding/json: %v %d %d %v %d",
					body, n, s.found, s.prompt, s.completed, s.hasCached, s.cached, found, prompt, completed, hasCached, cached)
			}
		}
	})
}

// BenchmarkUsageScanJSON is one non-streaming answer, as the fake upstream of the overhead report sends it.
func BenchmarkUsageScanJSON(b *testing.B) {
	body := []byte(`{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"fake","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,"prompt_tokens_details":{"cached_tokens":0}}}`)
	s := &usageScan{}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		s.reset()
		s.feed(body)
	}
	if !s.found || s.prompt != 9 {
		b.Fatalf("found %v prompt %d", s.found, s.prompt)
	}
}
