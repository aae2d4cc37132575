package disagg

import (
	"errors"
	"strings"
	"testing"
)

func TestScanEnd(t *testing.T) {
	f := func(body string, want int) {
		t.Helper()
		o, err := Scan([]byte(body))
		if err != nil {
			t.Fatalf("Scan(%q): %v", body, err)
		}
		if o.End != want {
			t.Fatalf("Scan(%q).End = %d, want %d", body, o.End, want)
		}
		if body[o.End] != '}' {
			t.Fatalf("Scan(%q).End is at %q, not the closing brace", body, body[o.End])
		}
	}
	f(`{}`, 1)
	f(`{"model":"m"}`, 12)
	f(" \t\r\n{\"model\":\"m\"} \t\r\n", 16)
	f(`{"model":"m"}`+"\n\n\n", 12)
	// Braces and quotes inside strings do not count.
	f(`{"a":"}","b":"\"}"}`, 18)
	f(`{"a":{"b":"}}}"},"c":"{"}`, 24)
	f(`{"messages":[{"role":"user","content":"close it: } ] }"}],"x":{"y":[1,{"z":"}"}]}}`, 81)
	// Escapes, unicode, numbers, literals, empty containers, deep nesting.
	f(`{"a":"\\","b":"\u00e9\/\b\f\n\r\t","c":-0.5e+10,"d":[true,false,null,{},[]]}`, 75)
	f(`{"a":`+strings.Repeat("[", 511)+strings.Repeat("]", 511)+`}`, 1027)
}

func TestScanRefuses(t *testing.T) {
	f := func(body, want string) {
		t.Helper()
		_, err := Scan([]byte(body))
		var se *SyntaxError
		if !errors.As(err, &se) {
			t.Fatalf("Scan(%q) = %v, want a *SyntaxError", body, err)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Scan(%q) = %q, want it to say %q", body, err, want)
		}
	}
	f(``, "not a JSON object")
	f(`   `, "not a JSON object")
	f(`[{"a":1}]`, "not a JSON object")
	f(`"x"`, "not a JSON object")
	f(`null`, "not a JSON object")
	f(`{"a":1}{"b":2}`, "data after the top-level object")
	f(`{"a":1} x`, "data after the top-level object")
	f(`{"a":1`, "unexpected end of input")
	f(`{"a":1,}`, "expected a string as an object key")
	f(`{"a" 1}`, "expected ':'")
	f(`{"a":1 "b":2}`, "expected ',' or '}'")
	f(`{"a":"}`, "unterminated string")
	f(`{"a":"x`+"\n"+`"}`, "control character in a string")
	f(`{"a":"\x"}`, "invalid escape")
	f(`{"a":"\u12G4"}`, "invalid \\u escape")
	f(`{"a":[1,]}`, "invalid value")
	f(`{"a":[1 2]}`, "expected ',' or ']'")
	f(`{"a":{"b":1]}`, "expected ',' or '}'")
	f(`{"a":01}`, "expected ',' or '}'")
	f(`{"a":1.}`, "invalid number")
	f(`{"a":1e}`, "invalid number")
	f(`{"a":tru}`, "invalid literal")
	f(`{"a":NaN}`, "invalid value")
	f(`{"a":`+strings.Repeat("[", 512)+strings.Repeat("]", 512)+`}`, "nesting deeper than 512")
}

func TestScanKeys(t *testing.T) {
	f := func(body string, want ...string) {
		t.Helper()
		o, err := Scan([]byte(body))
		if err != nil {
			t.Fatalf("Scan(%q): %v", body, err)
		}
		for _, k := range prefillKeys {
			wanted := false
			for _, w := range want {
				wanted = wanted || w == k.name
			}
			if o.Has(k.name) != wanted {
				t.Fatalf("Scan(%q).Has(%q) = %v, want %v", body, k.name, !wanted, wanted)
			}
		}
	}
	f(`{"model":"m","stream":true}`)
	f(`{"stream_options":{"include_usage":true}}`, "stream_options")
	f(`{"max_completion_tokens":5,"min_tokens":2,"min_completion_tokens":1}`,
		"max_completion_tokens", "min_tokens", "min_completion_tokens")
	// Python decodes escapes in keys: these are the same keys to vLLM.
	f(`{"stream\u005foptions":null,"min\u005Ftokens":1}`, "stream_options", "min_tokens")
	// Nested keys are not top-level keys.
	f(`{"extra":{"stream_options":{},"min_tokens":3}}`)
	// Near misses.
	f(`{"stream_option":1,"min_tokens ":1,"Min_tokens":1,"max_completion_token":1}`)
	if (Object{}).Has("stream") {
		t.Fatal(`Has("stream") = true for a key Scan does not track`)
	}
}

func TestKeyIs(t *testing.T) {
	f := func(raw, name string, want bool) {
		t.Helper()
		if got := keyIs([]byte(raw), name); got != want {
			t.Fatalf("keyIs(%q, %q) = %v, want %v", raw, name, got, want)
		}
	}
	f(`kv_transfer_params`, "kv_transfer_params", true)
	f(`kv\u005ftransfer\u005Fparams`, "kv_transfer_params", true)
	f(`\u006bv_transfer_params`, "kv_transfer_params", true)
	f(`kv_transfer_param`, "kv_transfer_params", false)
	f(`kv_transfer_paramss`, "kv_transfer_params", false)
	f(`kv_transfer_params\u00e9`, "kv_transfer_params", false)
	f(`a\/b`, "a/b", true)
	f(`a\tb`, "a\tb", true)
	f(``, "", true)
}
