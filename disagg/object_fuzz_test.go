package disagg

import (
	"encoding/json"
	"testing"
)

// FuzzScan: Scan accepts only one valid JSON object, its End is that object's closing brace, and every
// suffix spliced there leaves a valid object in which the gateway's members win.
func FuzzScan(f *testing.F) {
	for _, c := range clientBodies {
		f.Add([]byte(c.body))
	}
	for _, seed := range []string{`{}`, ` {"a":"}"} `, `{"a":1}{`, `[]`, `{"stream_options":1,"stream_options":2}`, "{\"a\":\"\xff\"}"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		o, err := Scan(body)
		if err != nil {
			return
		}
		if !json.Valid(body) || body[o.End] != '}' || ws(body, o.End+1) != len(body) {
			t.Fatalf("accepted %q with End %d", body, o.End)
		}
		f := func(suffix []byte, key, want string) {
			t.Helper()
			b := splice(body, o, suffix)
			var m map[string]json.RawMessage
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("spliced %q: %v", b, err)
			}
			if string(m[key]) != want {
				t.Fatalf("spliced %q: %s is %s, want %s", b, key, m[key], want)
			}
		}
		prefill := AppendPrefill(nil, o)
		f(prefill, "stream", "false")
		f(prefill, "max_tokens", "1")
		if o.Has("stream_options") {
			f(prefill, "stream_options", "null")
		}
		if o.Has("min_tokens") {
			f(prefill, "min_tokens", "0")
		}
		f(AppendDecode(nil, o, []byte(`{"x":1}`)), "kv_transfer_params", `{"x":1}`)
		f(AppendDecode(nil, o, nil), "kv_transfer_params", "null")
		f(AppendBootstrap(nil, o, "h", 1, 2), "bootstrap_room", "2")
	})
}
