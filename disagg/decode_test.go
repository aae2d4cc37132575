package disagg

import (
	"testing"
)

// answerChat is a prefill answer as vLLM's chat endpoint writes it, with the NixlConnector's params.
const answerChat = `{"id":"chatcmpl-3f2a","object":"chat.completion","created":1764763200,"model":"llama",` +
	`"choices":[{"index":0,"message":{"role":"assistant","content":"Once","refusal":null,"tool_calls":[]},` +
	`"logprobs":null,"finish_reason":"length","stop_reason":null}],` +
	`"usage":{"prompt_tokens":1843,"total_tokens":1844,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1792}},` +
	`"prompt_logprobs":null,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,` +
	`"remote_block_ids":[12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117,118,119,120,121,122,123,124,125,126,127,128,129,130],` +
	`"remote_engine_id":"6c1f0e6e-1b0a-4f5c-9d55-0a7e3a1f9c21","remote_request_id":"chatcmpl-3f2a-0","remote_host":"10.0.3.17","remote_port":5600,"tp_size":1}}`

// TestDecodeFields checks the decode request against vLLM's proxy (toy_proxy_server.py
// _handle_completions: kv_transfer_params = response_json.get("kv_transfer_params", {}); if
// kv_transfer_params: req_data["kv_transfer_params"] = kv_transfer_params), for every client body.
func TestDecodeFields(t *testing.T) {
	py := startPython(t)
	params, err := ParsePrefillAnswer([]byte(answerChat))
	if err != nil {
		t.Fatal(err)
	}
	want := decode(t, []byte(answerChat))["kv_transfer_params"]
	for _, c := range clientBodies {
		t.Run(c.name, func(t *testing.T) {
			body := []byte(c.body)
			o, err := Scan(body)
			if err != nil {
				t.Fatal(err)
			}
			d := splice(body, o, AppendDecode(nil, o, params))
			py.check(t, d)
			sameRequest(t, decode(t, d), proxyDecode(decode(t, body), want))
			// Nothing of the prefill request leaks into the decode request.
			if got := decode(t, d); got["stream"] != decode(t, body)["stream"] {
				t.Fatalf("stream = %v, want the client's", got["stream"])
			}
		})
	}
}

// TestDecodeWithoutParams: a prefill that kept no blocks leads to a plain request, the client's own
// kv_transfer_params replaced by null (the proxy would forward them; we never do).
func TestDecodeWithoutParams(t *testing.T) {
	py := startPython(t)
	for _, c := range clientBodies {
		body := []byte(c.body)
		o, err := Scan(body)
		if err != nil {
			t.Fatal(err)
		}
		d := splice(body, o, AppendDecode(nil, o, nil))
		py.check(t, d)
		want := decode(t, body)
		want["kv_transfer_params"] = nil
		sameRequest(t, decode(t, d), want)
	}
}

func TestDecodeSuffix(t *testing.T) {
	f := func(body, params, want string) {
		t.Helper()
		o, err := Scan([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		var p []byte
		if params != "" {
			p = []byte(params)
		}
		if got := string(AppendDecode(nil, o, p)); got != want {
			t.Fatalf("AppendDecode(%s, %s) = %s, want %s", body, params, got, want)
		}
	}
	f(`{"model":"m"}`, `{"a":1}`, `,"kv_transfer_params":{"a":1}`)
	f(`{}`, `{"a":1}`, `"kv_transfer_params":{"a":1}`)
	f(`{"model":"m"}`, ``, `,"kv_transfer_params":null`)
}
