package disagg

import (
	"testing"
)

// Client bodies as the engine sends them upstream: chat and completions, streaming or not, with the keys a
// prefill request treats specially, with odd whitespace and braces inside strings.
var clientBodies = []struct {
	name string
	body string
}{
	{"chat", `{"model":"llama","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}],"max_tokens":100,"temperature":0.2}`},
	{"chat stream", `{"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}`},
	{"chat max_completion_tokens", `{"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":true,"max_completion_tokens":300,"min_tokens":5}`},
	{"chat false stream_options", `{"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":false,"max_tokens":7,"max_completion_tokens":9}`},
	{"completions", `{"model":"llama","prompt":"Once upon a time","max_tokens":50,"echo":false,"logprobs":null}`},
	{"completions stream", `{"model":"llama","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"min_tokens":3,"min_completion_tokens":2}`},
	{"no limits", `{"model":"llama","prompt":"x"}`},
	{"trailing whitespace", "{\"model\":\"llama\",\"prompt\":\"x\",\"stream\":true}\n \t\r\n"},
	{"braces in strings", `{"model":"llama","messages":[{"role":"user","content":"return {\"a\": \"}\"} }}"}],"response_format":{"type":"json_schema","json_schema":{"name":"o","schema":{"type":"object","properties":{"a":{"type":"string","pattern":"^[}{]+$"}}}}},"stream":true,"stream_options":{"include_usage":false}}`},
	{"client kv_transfer_params", `{"model":"llama","prompt":"x","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"attacker.example","remote_port":4444,"remote_block_ids":[1]}}`},
	{"escaped keys", `{"model":"llama","prompt":"x","stream":true,"stream\u005foptions":{"include_usage":true},"min\u005ftokens":4}`},
}

// TestPrefillFields checks the prefill request, field by field, against vLLM's proxy
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, send_request_to_service: the
// kv_transfer_params literal, stream False, max_tokens 1, max_completion_tokens 1 if present, del
// stream_options, pop min_tokens and min_completion_tokens).
func TestPrefillFields(t *testing.T) {
	py := startPython(t)
	for _, c := range clientBodies {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			o, err := Scan(body)
			if err != nil {
				t.Fatal(err)
			}
			p := splice(body, o, AppendPrefill(nil, o))
			py.check(t, p)
			sameRequest(t, decode(t, p), proxyPrefill(decode(t, body)))
		})
	}
}

// TestPrefillSuffix pins the exact bytes, so a change of order or spelling shows.
func TestPrefillSuffix(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		o, err := Scan([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got := string(AppendPrefill([]byte("prefix"), o)); got != "prefix"+want {
			t.Fatalf("AppendPrefill for %s\n got %s\nwant prefix%s", body, got, want)
		}
	}
	const params = `"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`
	f(`{"model":"m"}`, ","+params+`,"stream":false,"max_tokens":1`)
	f(`{}`, params+`,"stream":false,"max_tokens":1`)
	f(`{"stream_options":{},"max_completion_tokens":2,"min_tokens":1,"min_completion_tokens":1}`,
		","+params+`,"stream":false,"max_tokens":1,"max_completion_tokens":1,"stream_options":null,"min_tokens":0,"min_completion_tokens":0`)
}

func TestPrefillEmptyObject(t *testing.T) {
	body := []byte(" {  } ")
	o, err := Scan(body)
	if err != nil {
		t.Fatal(err)
	}
	p := splice(body, o, AppendPrefill(nil, o))
	startPython(t).check(t, p)
	sameRequest(t, decode(t, p), proxyPrefill(map[string]any{}))
}
