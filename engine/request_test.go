package engine

import (
	"fmt"
	"testing"
)

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

func TestPromptKey(t *testing.T) {
	f := func(body string, ep endpoint, want string) {
		t.Helper()
		var c call
		v, err := c.parser.Parse(body)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendPromptKey(nil, v, ep)); got != want {
			t.Fatalf("key %q, want %q", got, want)
		}
	}
	f(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, epChat, "system\x1fbe brief\x1euser\x1fhi\x1e")
	// Escaped and unescaped spellings give the same key.
	f(`{"messages":[{"role":"user","content":"caf\u00e9 \"x\""}]}`, epChat, "user\x1fcafé \"x\"\x1e")
	f(`{"messages":[{"role":"user","content":"café \"x\""}]}`, epChat, "user\x1fcafé \"x\"\x1e")
	// Text parts in order; images are not text.
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"b"}]}]}`, epChat, "user\x1fab\x1e")
	// Assistant tool calls have null content.
	f(`{"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`, epChat, "assistant\x1f\x1e")
	f(`{"prompt":"once upon"}`, epCompletions, "once upon")
	f(`{"prompt":["a","b"]}`, epCompletions, "a\x1eb\x1e")
	f(`{"prompt":[1,2,3]}`, epCompletions, "1,2,3,")
	f(`{"input":"embed me"}`, epEmbeddings, "embed me")
}

func TestTopLevelValue(t *testing.T) {
	f := func(body string, want string) {
		t.Helper()
		s, e := topLevelValue([]byte(body), "model")
		if body[s:e] != want {
			t.Fatalf("topLevelValue(%s) = %q, want %q", body, body[s:e], want)
		}
	}
	f(`{"model":"m"}`, `"m"`)
	f(` { "x" : {"model":"inner"}, "model" : "a\"b" , "y":[1,{"model":2}]}`, `"a\"b"`)
	f(`{"mod\u0065l":"escaped"}`, `"escaped"`)
	f(`{"model":"a","model":"b"}`, `"a"`)
	f(`{"messages":[]}`, ``)
}
