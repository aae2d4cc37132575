package sim

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"
)

// typedEvent is one event of a typed SSE stream (the Responses and Messages APIs): its name and data.
type typedEvent struct {
	name string
	data map[string]any
}

// typedStream posts body and reads "event:" / "data:" pairs until the body ends.
func typedStream(t *testing.T, url, body string) []typedEvent {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var events []typedEvent
	sc := bufio.NewScanner(resp.Body)
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			name = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(line[len("data: "):]), &d); err != nil {
				t.Fatalf("data %q: %v", line, err)
			}
			if d["type"] != name {
				t.Fatalf("event %q carries type %v", name, d["type"])
			}
			events = append(events, typedEvent{name, d})
			name = ""
		default:
			t.Fatalf("line %q is neither event: nor data:", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return events
}

func names(events []typedEvent) string {
	var n []string
	for _, e := range events {
		n = append(n, e.name)
	}
	return strings.Join(n, " ")
}

func TestResponsesAPI(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	prompt := words("responses", 40)
	body := `{"model":"sim-model","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"` + prompt + `"}]}]`

	status, _, b, err := c.post(e.URL()+"/v1/responses", body+`}`)
	if err != nil || status != 200 {
		t.Fatalf("responses: %d %s %v", status, b, err)
	}
	var r struct {
		ID, Object, Model, Status string
		Output                    []struct {
			Type, Role string
			Content    []struct{ Type, Text string }
		}
		Usage struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			TotalTokens        int `json:"total_tokens"`
			InputTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		}
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Model != "sim-model" || r.Status != "completed" ||
		len(r.Output) != 1 || r.Output[0].Type != "message" || r.Output[0].Role != "assistant" ||
		len(r.Output[0].Content) != 1 || r.Output[0].Content[0].Type != "output_text" || r.Output[0].Content[0].Text != " the sim is a" {
		t.Fatalf("response: %s", b)
	}
	if u := r.Usage; u.InputTokens < 40 || u.OutputTokens != 4 || u.TotalTokens != u.InputTokens+4 || u.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage: %s", b)
	}
	// The same conversation as a chat request shares the cached prefix: one template for both.
	_, out := c.completion(e.URL()+"/v1/chat/completions", `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"`+prompt+`"}]}`)
	if out.Usage.PromptTokens != r.Usage.InputTokens || out.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("chat after responses: %+v", out.Usage)
	}

	// max_output_tokens cuts the answer: incomplete. Streamed, the typed events in order.
	events := typedStream(t, e.URL()+"/v1/responses", body+`,"stream":true,"max_output_tokens":3}`)
	want := "response.created response.output_item.added response.content_part.added " +
		"response.output_text.delta response.output_text.delta response.output_text.delta " +
		"response.output_text.done response.content_part.done response.output_item.done response.completed"
	if names(events) != want {
		t.Fatalf("events %q\nwant   %q", names(events), want)
	}
	text := ""
	for i, ev := range events {
		if ev.data["sequence_number"] != float64(i) {
			t.Fatalf("event %d: sequence_number %v", i, ev.data["sequence_number"])
		}
		if ev.name == "response.output_text.delta" {
			text += ev.data["delta"].(string)
		}
	}
	done := events[len(events)-1].data["response"].(map[string]any)
	usage := done["usage"].(map[string]any)
	if text != " the sim is" || done["status"] != "incomplete" || usage["output_tokens"] != float64(3) ||
		usage["input_tokens_details"].(map[string]any)["cached_tokens"].(float64) == 0 {
		t.Fatalf("stream text %q, final response %v", text, done)
	}

	for _, bad := range []string{`{"model":"sim-model"}`, `{"input":[]}`, `{"input":[{"content":"x"}]}`, `{"input":5}`, `{"input":"x","instructions":1}`} {
		if status, _, b, _ := c.post(e.URL()+"/v1/responses", bad); status != 400 || !strings.Contains(string(b), `"type":"BadRequestError"`) {
			t.Errorf("%s: %d %s", bad, status, b)
		}
	}
}

func TestMessagesAPI(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	prompt := words("messages", 40)
	body := `{"model":"sim-model","system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"` + prompt + `"}]}]`

	status, _, b, err := c.post(e.URL()+"/v1/messages", body+`,"max_tokens":100}`)
	if err != nil || status != 200 {
		t.Fatalf("messages: %d %s %v", status, b, err)
	}
	var m struct {
		ID, Type, Role, Model string
		Content               []struct{ Type, Text string }
		StopReason            string `json:"stop_reason"`
		Usage                 struct {
			InputTokens  int `json:"input_tokens"`
			OutputTokens int `json:"output_tokens"`
			CacheRead    int `json:"cache_read_input_tokens"`
		}
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	// max_tokens 100 is above the engine's output (4 tokens): the turn ends by itself.
	if !strings.HasPrefix(m.ID, "msg_") || m.Type != "message" || m.Role != "assistant" || m.Model != "sim-model" ||
		len(m.Content) != 1 || m.Content[0].Type != "text" || m.Content[0].Text != " the sim is a" || m.StopReason != "end_turn" ||
		m.Usage.InputTokens < 40 || m.Usage.OutputTokens != 4 || m.Usage.CacheRead != 0 {
		t.Fatalf("message: %s", b)
	}

	events := typedStream(t, e.URL()+"/v1/messages", body+`,"stream":true,"max_tokens":2}`)
	want := "message_start content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if names(events) != want {
		t.Fatalf("events %q\nwant   %q", names(events), want)
	}
	start := events[0].data["message"].(map[string]any)
	delta := events[5].data
	if start["usage"].(map[string]any)["cache_read_input_tokens"].(float64) == 0 ||
		delta["delta"].(map[string]any)["stop_reason"] != "max_tokens" || delta["usage"].(map[string]any)["output_tokens"] != float64(2) {
		t.Fatalf("message_start %v, message_delta %v", start, delta)
	}

	// Errors in Anthropic's shape.
	for bad, typ := range map[string]string{
		`{"messages":[{"role":"user","content":"x"}]}`:                                "invalid_request_error",
		`{"max_tokens":0,"messages":[{"role":"user","content":"x"}]}`:                 "invalid_request_error",
		`{"model":"other","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`: "not_found_error",
	} {
		status, _, b, _ := c.post(e.URL()+"/v1/messages", bad)
		var ae struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if json.Unmarshal(b, &ae); status/100 != 4 || ae.Type != "error" || ae.Error.Type != typ || ae.Error.Message == "" {
			t.Errorf("%s: %d %s, want %s", bad, status, b, typ)
		}
	}
}

func TestEmbeddingsAPI(t *testing.T) {
	e := startEngine(t, testConfig())
	c := newClient(t, 10*time.Second)
	type embeddings struct {
		Object string
		Data   []struct {
			Index     int
			Object    string
			Embedding json.RawMessage
		}
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	post := func(body string) embeddings {
		t.Helper()
		status, _, b, err := c.post(e.URL()+"/v1/embeddings", body)
		if err != nil || status != 200 {
			t.Fatalf("%s: %d %s %v", body, status, b, err)
		}
		var out embeddings
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	floats := func(raw json.RawMessage) []float64 {
		var v []float64
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return v
	}
	out := post(`{"model":"sim-model","input":["hello world","hello world","something else"]}`)
	if out.Object != "list" || len(out.Data) != 3 || out.Usage.PromptTokens == 0 || out.Usage.TotalTokens != out.Usage.PromptTokens {
		t.Fatalf("embeddings: %+v", out)
	}
	a, b, other := floats(out.Data[0].Embedding), floats(out.Data[1].Embedding), floats(out.Data[2].Embedding)
	var norm, dot, dotOther float64
	for i := range a {
		norm += a[i] * a[i]
		dot += a[i] * b[i]
		dotOther += a[i] * other[i]
	}
	if len(a) != embeddingDims || math.Abs(norm-1) > 1e-5 || math.Abs(dot-1) > 1e-5 || dotOther > 0.9 ||
		out.Data[2].Index != 2 || out.Data[2].Object != "embedding" {
		t.Fatalf("vectors: %d dims, norm %v, equal inputs %v, different inputs %v", len(a), norm, dot, dotOther)
	}
	// base64 of little-endian float32, the same vector; dimensions; token ids.
	out = post(`{"input":"hello world","encoding_format":"base64","dimensions":8}`)
	var s string
	json.Unmarshal(out.Data[0].Embedding, &s)
	raw, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(raw) != 32 {
		t.Fatalf("base64 embedding %q: %v", s, err)
	}
	var norm8 float64
	for i := 0; i < 8; i++ {
		x := float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])))
		norm8 += x * x
	}
	if math.Abs(norm8-1) > 1e-5 {
		t.Fatalf("base64 vector norm %v", norm8)
	}
	if out := post(`{"input":[[5,6,7],[8]]}`); len(out.Data) != 2 || out.Usage.PromptTokens != 4 {
		t.Fatalf("token-id inputs: %+v", out)
	}
	for _, bad := range []string{`{}`, `{"input":[]}`, `{"input":""}`, `{"input":[-1]}`, `{"input":"x","encoding_format":"hex"}`, `{"input":"x","dimensions":0}`, `{"input":{}}`} {
		if status, _, b, _ := c.post(e.URL()+"/v1/embeddings", bad); status != 400 {
			t.Errorf("%s: %d %s", bad, status, b)
		}
	}
}
