package loadtest

import (
	"net/http"
	"strings"
	"testing"
)

func TestParseStream(t *testing.T) {
	f := func(body string, wantContent string, wantPrompt, wantCached, wantEvents int, wantErr string) {
		t.Helper()
		r, err := ParseStream([]byte(body))
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("got error %v; want one containing %q", err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("unexpected error: %s", err)
		}
		if r.Content != wantContent || r.PromptTokens != wantPrompt || r.CachedTokens != wantCached || r.Events != wantEvents {
			t.Fatalf("got %+v; want content %q prompt %d cached %d events %d", r, wantContent, wantPrompt, wantCached, wantEvents)
		}
	}
	role := `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	tok := func(s string) string {
		return `data: {"choices":[{"index":0,"delta":{"content":"` + s + `"}}],"usage":null}` + "\n\n"
	}
	usage := `data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}` + "\n\n"
	done := "data: [DONE]\n\n"
	f(role+tok(" the")+tok(" sim")+usage+done, " the sim", 40, 32, 4, "")
	f(role+tok("a")+done, "a", 0, 0, 2, "")                                           // no usage event: zeros
	f(strings.ReplaceAll(role+tok("x")+usage+done, "\n", "\r\n"), "x", 40, 32, 3, "") // CRLF
	f(": ping\n\n"+role+"event: message\n"+tok("y")+done, "y", 0, 0, 2, "")
	f(role+tok("a"), "", 0, 0, 0, "without data: [DONE]")
	f(role+`data: {"error":{"message":"upstream died","type":"x","code":"502"}}`+"\n\n", "", 0, 0, 0, "upstream died")
	f("data: {nope\n\n", "", 0, 0, 0, "cannot parse stream event")
	// completions streams carry choices[0].text
	f(`data: {"choices":[{"index":0,"text":"hi"}]}`+"\n\n"+done, "hi", 0, 0, 1, "")
}

func TestParseJSON(t *testing.T) {
	r, err := ParseJSON([]byte(`{"choices":[{"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`))
	if err != nil || r.Content != "ok" || r.PromptTokens != 10 || !r.HasUsage {
		t.Fatalf("got %+v, %v", r, err)
	}
	if _, err := ParseJSON([]byte(`{"error":{"message":"bad key"}}`)); err == nil || !strings.Contains(err.Error(), "bad key") {
		t.Fatalf("got %v; want the error message", err)
	}
}

func TestParseRouting(t *testing.T) {
	h := http.Header{}
	h.Set("x-rolter-target", "sim-3")
	h.Set("X-ROLTER-DECISION", "prefix_hit")
	if got := ParseRouting(h); got.Target != "sim-3" || got.Decision != "prefix_hit" {
		t.Fatalf("got %+v", got)
	}
	if got := ParseRouting(http.Header{}); got.Target != "" || got.Decision != "" {
		t.Fatalf("got %+v from no headers", got)
	}
}

func TestShares(t *testing.T) {
	f := func(counts map[string]int, expected []string, wantNames string, wantMaxMin float64) {
		t.Helper()
		names, mm := Shares(counts, expected)
		if strings.Join(names, ",") != wantNames || mm != wantMaxMin {
			t.Fatalf("got %v %v; want %s %v", names, mm, wantNames, wantMaxMin)
		}
	}
	f(map[string]int{"a": 10, "b": 10}, nil, "a,b", 1)
	f(map[string]int{"a": 15, "b": 10, "c": 12}, nil, "a,b,c", 1.5)
	f(map[string]int{"a": 15, "b": 10}, []string{"a", "b", "c"}, "a,b,c", -1) // c idle
	f(map[string]int{"": 7}, nil, "", 0)                                      // no gateway: no target header
	f(nil, nil, "", 0)
}

func TestFormatTokenIDs(t *testing.T) {
	if got := FormatTokenIDs([]uint32{2, 31430, 4}); got != "2,31430,4" {
		t.Fatalf("got %q", got)
	}
	if got := FormatTokenIDs(nil); got != "" {
		t.Fatalf("got %q", got)
	}
}

func TestCheckLoopback(t *testing.T) {
	f := func(u string, ok bool) {
		t.Helper()
		err := CheckLoopback(u)
		if (err == nil) != ok {
			t.Fatalf("%s: got %v, want ok=%v", u, err, ok)
		}
	}
	f("http://127.0.0.1:8080", true)
	f("http://127.9.9.9", true)
	f("http://localhost:1/v1", true)
	f("https://LOCALHOST", true)
	f("http://[::1]:8080", true)
	f("http://10.0.0.1:8080", false)
	f("http://example.com", false)
	f("http://0.0.0.0:8080", false) // means "every interface" when listening; not loopback
	f("http://[::]:8080", false)
	f("ftp://127.0.0.1", false)
	f("127.0.0.1:8080", false)
	f("http://", false)
}
