package disagg

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"
)

// FuzzPrefillAnswer feeds ParsePrefillAnswer hostile answers. It must never panic, and what it returns must
// be safe to splice: a subslice of the answer, a valid JSON object, equal to what encoding/json (last key
// wins, like json.loads) finds as the answer's kv_transfer_params; and it accepts only valid JSON.
func FuzzPrefillAnswer(f *testing.F) {
	for _, seed := range []string{
		answerChat,
		`{"kv_transfer_params":null}`,
		`{"kv_transfer_params":{"a":[1,{"b":"}"}]}}`,
		`{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}`,
		`{"kv\u005ftransfer_params":{"b":2}}`,
		`{"kv_transfer_params":"{}"}`,
		`{"kv_transfer_params":{"a":1}},"x":1}`,
		`{"kv_transfer_params":{"a":"\ud800"}}`,
		`{"kv_transfer_params":{"a":1e999,"b":-0.0,"c":0e-0}}`,
		`[[[[[[[[[[`,
		`{"a":"\`,
		"{\"kv_transfer_params\":{\"a\":\"\xff\"}}",
		"",
		"null",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		params, err := ParsePrefillAnswer(answer)
		if err != nil {
			if params != nil {
				t.Fatalf("params %q with error %v", params, err)
			}
			if errors.Is(err, ErrNoKVTransferParams) && !json.Valid(answer) {
				t.Fatalf("ErrNoKVTransferParams for invalid JSON %q", answer)
			}
			return
		}
		if !json.Valid(answer) {
			t.Fatalf("accepted invalid JSON %q", answer)
		}
		if len(params) == 0 || params[0] != '{' || !json.Valid(params) || !utf8.Valid(params) {
			t.Fatalf("params %q are not a valid JSON object", params)
		}
		if !within(params, answer) {
			t.Fatalf("params %q are not a subslice of the answer", params)
		}
		var top map[string]json.RawMessage
		if err := json.Unmarshal(answer, &top); err != nil {
			t.Fatalf("accepted %q that encoding/json refuses: %v", answer, err)
		}
		if want := top["kv_transfer_params"]; !bytes.Equal(params, want) {
			t.Fatalf("params %q, encoding/json finds %q", params, want)
		}
		// Spliced into a body, the params stay one member.
		o, err := Scan([]byte(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		d := splice([]byte(`{"model":"m"}`), o, AppendDecode(nil, o, params))
		var m map[string]json.RawMessage
		if err := json.Unmarshal(d, &m); err != nil || len(m) != 2 {
			t.Fatalf("decode body %q: %v, %d members", d, err, len(m))
		}
	})
}

// within reports whether sub is a subslice of b's memory.
func within(sub, b []byte) bool {
	if len(sub) == 0 || len(b) == 0 {
		return false
	}
	for i := range b {
		if &b[i] == &sub[0] {
			return i+len(sub) <= len(b)
		}
	}
	return false
}
