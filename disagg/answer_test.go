package disagg

import (
	"errors"
	"strings"
	"testing"
)

func TestParsePrefillAnswer(t *testing.T) {
	f := func(answer, want string) {
		t.Helper()
		got, err := ParsePrefillAnswer([]byte(answer))
		if err != nil {
			t.Fatalf("ParsePrefillAnswer(%.80s): %v", answer, err)
		}
		if string(got) != want {
			t.Fatalf("ParsePrefillAnswer(%.80s) = %s, want %s", answer, got, want)
		}
	}
	params := answerChat[strings.Index(answerChat, `"kv_transfer_params":`)+len(`"kv_transfer_params":`) : len(answerChat)-1]
	f(answerChat, params)
	// A completions answer, params first, whitespace as Python's json.dumps writes it by default.
	f(`{"kv_transfer_params": {"do_remote_prefill": true, "remote_block_ids": [[1, 2], [3]]}, "choices": [{"text": "}"}]}`,
		`{"do_remote_prefill": true, "remote_block_ids": [[1, 2], [3]]}`)
	// The last of repeated keys, as json.loads keeps; escaped spellings are the same key.
	f(`{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}`, `{"b":2}`)
	f(`{"kv_transfer_params":{"a":1},"kv\u005ftransfer_params":{"b":2}}`, `{"b":2}`)
	f(`{"kv_transfer_params":null,"kv_transfer_params":{}}`, `{}`)
	// Nested kv_transfer_params are not the answer's.
	f(`{"x":{"kv_transfer_params":{"no":1}},"kv_transfer_params":{"yes":1}}`, `{"yes":1}`)
	f("\n{\"kv_transfer_params\":{\"s\":\"}\\\"{\"}}\n", `{"s":"}\"{"}`)
}

func TestParsePrefillAnswerNoParams(t *testing.T) {
	f := func(answer string) {
		t.Helper()
		got, err := ParsePrefillAnswer([]byte(answer))
		if !errors.Is(err, ErrNoKVTransferParams) || got != nil {
			t.Fatalf("ParsePrefillAnswer(%s) = %s, %v; want ErrNoKVTransferParams", answer, got, err)
		}
	}
	f(`{}`)
	f(`{"id":"chatcmpl-1","choices":[{"finish_reason":"stop"}]}`)
	f(`{"id":"cmpl-1","choices":[{"text":""}],"kv_transfer_params":null}`)
	f(`{"kv_transfer_params":{"a":1},"kv_transfer_params":null}`)
	f(`{"x":{"kv_transfer_params":{"a":1}}}`)
}

func TestParsePrefillAnswerRefuses(t *testing.T) {
	f := func(answer, want string) {
		t.Helper()
		got, err := ParsePrefillAnswer([]byte(answer))
		if err == nil || got != nil {
			t.Fatalf("ParsePrefillAnswer(%.60s) = %.60s, nil; want an error", answer, got)
		}
		if errors.Is(err, ErrNoKVTransferParams) {
			t.Fatalf("ParsePrefillAnswer(%.60s) = ErrNoKVTransferParams; want a failure", answer)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("ParsePrefillAnswer(%.60s) = %q, want it to say %q", answer, err, want)
		}
	}
	f(``, "not a JSON object")
	f(`<html><body>502 Bad Gateway</body></html>`, "not a JSON object")
	f(`data: {"kv_transfer_params":{}}`, "not a JSON object")
	f(`[{"kv_transfer_params":{}}]`, "not a JSON object")
	f(`{"kv_transfer_params":{"a":1}`, "unexpected end of input")
	f(`{"kv_transfer_params":{"a":1}}}`, "data after the top-level object")
	f(`{"kv_transfer_params":{"a":1}},"model":"evil"}`, "data after the top-level object")
	f(`{"kv_transfer_params":{"a":1},"model":"evil"`, "unexpected end of input")
	f(`{"kv_transfer_params":"{\"a\":1}"}`, "kv_transfer_params is a string, not an object")
	f(`{"kv_transfer_params":[1,2]}`, "is an array")
	f(`{"kv_transfer_params":true}`, "is a boolean")
	f(`{"kv_transfer_params":42}`, "is a number")
	f(`{"kv_transfer_params":{"a":NaN}}`, "invalid value")
	f(`{"kv_transfer_params":{"a":"`+"\x01"+`"}}`, "control character")
	f(`{"kv_transfer_params":{"a":"\q"}}`, "invalid escape")
	f(`{"kv_transfer_params":{"a":"`+"\xff\xfe"+`"}}`, "not valid UTF-8")
	f(`{"kv_transfer_params":`+strings.Repeat(`{"a":`, 600)+`1`+strings.Repeat(`}`, 600)+`}`, "nesting deeper than 512")
	f(`{"kv_transfer_params":{"ids":[`+strings.Repeat("1,", MaxKVTransferParamsBytes/2)+`1]}}`, "more than 1048576")
	// Garbage after valid params still refuses the whole answer.
	f(`{"kv_transfer_params":{"a":1},"usage":{"x":]}}`, "invalid value")
}

func TestParsePrefillAnswerTooLarge(t *testing.T) {
	big := make([]byte, MaxAnswerBytes+1)
	if _, err := ParsePrefillAnswer(big); !errors.Is(err, ErrAnswerTooLarge) {
		t.Fatalf("ParsePrefillAnswer(%d bytes) = %v, want ErrAnswerTooLarge", len(big), err)
	}
}

// TestParsePrefillAnswerDeepArrays: nesting far past the bound costs one pass and no stack: the scanner
// stops at depth 512 whatever follows.
func TestParsePrefillAnswerDeepArrays(t *testing.T) {
	answer := []byte(`{"usage":` + strings.Repeat("[", MaxAnswerBytes-20))
	_, err := ParsePrefillAnswer(answer)
	var se *SyntaxError
	if !errors.As(err, &se) || se.Offset != len(`{"usage":`)+511 {
		t.Fatalf("ParsePrefillAnswer(deep) = %v, want a *SyntaxError at the 512th '['", err)
	}
}
