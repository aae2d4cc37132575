package accesslog

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// exampleRecord is the request of the example lines in the package doc.
func exampleRecord() *Record {
	var r Record
	r.Reset()
	r.Time = time.Date(2026, 11, 25, 11, 0, 0, 123_456_789, time.FixedZone("CET", 3600))
	r.SetRequestID([]byte("req-7f3a"))
	r.Client = netip.MustParseAddrPort("10.0.0.7:51234")
	r.Path = "/v1/chat/completions"
	r.Route, r.Model, r.Target = "llama", "llama", "vllm-2"
	r.Strategy, r.Decision, r.Score = "cache_aware", "prefix_hit", 0.8125
	r.Status = 200
	r.UpstreamHeaders = 41_250_999 * time.Nanosecond
	r.FirstByte = 41_913 * time.Microsecond
	r.Duration = 1873_004 * time.Microsecond
	r.BytesOut = 18342
	r.PromptTokens, r.CachedTokens = 2048, 1664
	r.Stream = true
	r.TraceID = [16]byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	r.SpanID = [8]byte{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
	return &r
}

// The example lines of the package doc, byte for byte.
const (
	exampleJSON = `{"time":"2026-11-25T10:00:00.123Z","request_id":"req-7f3a","client":"10.0.0.7:51234","path":"/v1/chat/completions","route":"llama","model":"llama","target":"vllm-2","prefill_target":null,"strategy":"cache_aware","decision":"prefix_hit","score":0.8125,"status":200,"retries":0,"upstream_headers_ms":41.250,"first_byte_ms":41.913,"duration_ms":1873.004,"bytes_out":18342,"prompt_tokens":2048,"cached_tokens":1664,"stream":true,"error":null,"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}` + "\n"
	exampleText = `time=2026-11-25T10:00:00.123Z request_id=req-7f3a client=10.0.0.7:51234 path=/v1/chat/completions route=llama model=llama target=vllm-2 strategy=cache_aware decision=prefix_hit score=0.8125 status=200 retries=0 upstream_headers_ms=41.250 first_byte_ms=41.913 duration_ms=1873.004 bytes_out=18342 prompt_tokens=2048 cached_tokens=1664 stream=true trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7` + "\n"
)

// fieldNames is the documented field list, in order.
var fieldNames = []string{
	"time", "request_id", "client", "path", "route", "model", "target", "prefill_target", "strategy", "decision", "score",
	"status", "retries", "upstream_headers_ms", "first_byte_ms", "duration_ms", "bytes_out", "prompt_tokens",
	"cached_tokens", "stream", "error", "trace_id", "span_id",
}

func TestFormatGolden(t *testing.T) {
	f := func(name string, got []byte, want string) {
		t.Helper()
		if string(got) != want {
			t.Fatalf("%s:\ngot  %s\nwant %s", name, got, want)
		}
	}
	f("json example", AppendJSON(nil, exampleRecord()), exampleJSON)
	f("text example", AppendText(nil, exampleRecord()), exampleText)

	// A request refused before routing: unknown values are null in JSON and absent in text.
	var r Record
	r.Reset()
	r.Time = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r.SetRequestID([]byte("abc"))
	r.Client = netip.MustParseAddrPort("[2001:db8::1]:443")
	r.Path = "/v1/completions"
	r.Model = "no-such-model"
	r.Status = 404
	r.Duration = 250 * time.Microsecond
	r.Error = "model_not_found"
	f("json refused", AppendJSON(nil, &r), `{"time":"2026-01-02T03:04:05.000Z","request_id":"abc","client":"[2001:db8::1]:443","path":"/v1/completions","route":null,"model":"no-such-model","target":null,"prefill_target":null,"strategy":null,"decision":null,"score":null,"status":404,"retries":0,"upstream_headers_ms":null,"first_byte_ms":null,"duration_ms":0.250,"bytes_out":0,"prompt_tokens":null,"cached_tokens":null,"stream":false,"error":"model_not_found","trace_id":null,"span_id":null}`+"\n")
	f("text refused", AppendText(nil, &r), `time=2026-01-02T03:04:05.000Z request_id=abc client=[2001:db8::1]:443 path=/v1/completions model=no-such-model status=404 retries=0 duration_ms=0.250 bytes_out=0 stream=false error=model_not_found`+"\n")

	// The zero Record after Reset: every field null but the ones that always have a value.
	r.Reset()
	f("json empty", AppendJSON(nil, &r), `{"time":null,"request_id":null,"client":null,"path":null,"route":null,"model":null,"target":null,"prefill_target":null,"strategy":null,"decision":null,"score":null,"status":null,"retries":0,"upstream_headers_ms":null,"first_byte_ms":null,"duration_ms":null,"bytes_out":0,"prompt_tokens":null,"cached_tokens":null,"stream":false,"error":null,"trace_id":null,"span_id":null}`+"\n")
	f("text empty", AppendText(nil, &r), "retries=0 bytes_out=0 stream=false\n")

	// Appending keeps what dst holds.
	f("append", AppendText([]byte("x\n"), &r), "x\nretries=0 bytes_out=0 stream=false\n")
}

func TestJSONFieldsInDocumentedOrder(t *testing.T) {
	line := AppendJSON(nil, exampleRecord())
	dec := json.NewDecoder(strings.NewReader(string(line)))
	if _, err := dec.Token(); err != nil { // {
		t.Fatalf("cannot read %s: %s", line, err)
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatalf("cannot read key: %s", err)
		}
		keys = append(keys, k.(string))
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("cannot read value of %v: %s", k, err)
		}
	}
	if fmt.Sprint(keys) != fmt.Sprint(fieldNames) {
		t.Fatalf("keys:\ngot  %v\nwant %v", keys, fieldNames)
	}
}

func TestDurationMillis(t *testing.T) {
	f := func(d time.Duration, want string) {
		t.Helper()
		var r Record
		r.Reset()
		r.Duration = d
		got := AppendText(nil, &r)
		if !strings.Contains(string(got), " duration_ms="+want+" ") && want != "" {
			t.Fatalf("duration %v: got %q, want duration_ms=%s", d, got, want)
		}
		if want == "" && strings.Contains(string(got), "duration_ms") {
			t.Fatalf("duration %v: got %q, want no duration", d, got)
		}
	}
	f(1, "0.000")
	f(time.Microsecond, "0.001")
	f(999*time.Microsecond, "0.999")
	f(time.Millisecond, "1.000")
	f(12*time.Millisecond+345*time.Microsecond+999, "12.345")
	f(3*time.Hour, "10800000.000")
	f(0, "")
	f(-time.Second, "")
}

func TestEscape(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		got := string(appendEscaped(nil, in))
		if got != want {
			t.Fatalf("escape(%q) = %s; want %s", in, got, want)
		}
		if !utf8.ValidString(got) {
			t.Fatalf("escape(%q) is not valid UTF-8: %q", in, got)
		}
	}
	f("", "")
	f("plain-id_42", "plain-id_42")
	f(`a"b\c`, `a\"b\\c`)
	f("line\nforged\r\t", `line\nforged\r\t`)
	f("\x00\x1b[31m\x7f", `\u0000\u001b[31m\u007f`)
	f("bad\xff\xfeutf8", `bad\ufffd\ufffdutf8`)
	f("\xe2\x80", `\ufffd\ufffd`) // a truncated 3-byte sequence
	f("caf\u00e9 \u4e16\u754c \U0001F600", "caf\u00e9 \u4e16\u754c \U0001F600")
	f("c1\u0085\u009b", `c1\u0085\u009b`)
	f("ls\u2028ps\u2029", `ls\u2028ps\u2029`)
	f("bidi\u202eevil\u2066x\u2069", `bidi\u202eevil\u2066x\u2069`)
}

func TestNeedsQuote(t *testing.T) {
	f := func(in string, want bool) {
		t.Helper()
		if got := needsQuote(in); got != want {
			t.Fatalf("needsQuote(%q) = %v; want %v", in, got, want)
		}
	}
	f("abc", false)
	f("/v1/chat/completions", false)
	f("meta-llama/Llama-3.1-8B:fp8", false)
	f("a b", true)
	f("a=b", true)
	f(`a"b`, true)
	f(`a\b`, true)
	f("a\tb", true)
	f("caf\u00e9", true)
	f("\x7f", true)
}

// TestForgingAttempts feeds values that try to break out of their field or line; each line must stay one
// line, parse back to exactly the documented fields, and give the value back (invalid UTF-8 replaced).
func TestForgingAttempts(t *testing.T) {
	f := func(id, target string) {
		t.Helper()
		r := exampleRecord()
		r.SetRequestID([]byte(id))
		r.Target = target
		// Each invalid byte becomes one U+FFFD (strings.ToValidUTF8 would fold a run into one).
		wantID := replaceEachInvalid(id[:min(len(id), MaxRequestID)])
		wantTarget := replaceEachInvalid(target)

		line := AppendJSON(nil, r)
		if strings.Count(string(line), "\n") != 1 || line[len(line)-1] != '\n' {
			t.Fatalf("JSON line for id %q is not one line: %q", id, line)
		}
		if !utf8.Valid(line) {
			t.Fatalf("JSON line for id %q is not valid UTF-8: %q", id, line)
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("JSON line for id %q does not parse: %s\n%s", id, err, line)
		}
		if len(m) != len(fieldNames) {
			t.Fatalf("JSON line for id %q has %d keys; want %d: %s", id, len(m), len(fieldNames), line)
		}
		if m["request_id"] != wantID || m["target"] != wantTarget || m["route"] != "llama" {
			t.Fatalf("JSON line for id %q: request_id %q target %q route %v", id, m["request_id"], m["target"], m["route"])
		}

		line = AppendText(nil, r)
		if strings.Count(string(line), "\n") != 1 || line[len(line)-1] != '\n' {
			t.Fatalf("text line for id %q is not one line: %q", id, line)
		}
		kv := parseLogfmt(t, string(line[:len(line)-1]))
		if len(kv) != len(fieldNames)-2 { // error and prefill_target are empty: left out
			t.Fatalf("text line for id %q has %d fields; want %d: %s", id, len(kv), len(fieldNames)-2, line)
		}
		if kv["request_id"] != wantID || kv["target"] != wantTarget || kv["route"] != "llama" {
			t.Fatalf("text line for id %q: request_id %q target %q route %q", id, kv["request_id"], kv["target"], kv["route"])
		}
	}
	f("id\nstatus=500", "vllm-2")
	f(`id" status="500`, "vllm-2")
	f(`id\`, "vllm-2")
	f("id\r\n{\"time\":\"forged\"}", "vllm-2")
	f("id\xff\xfe", "vllm\xc0")
	f("id\u2028x", "t\u202e")
	f("id\x1b]0;pwned\x07", "t t=u")
	f(strings.Repeat("\"\n", MaxRequestID), "x")
}

func replaceEachInvalid(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		b.WriteRune(r) // RuneError for each invalid byte
		i += n
	}
	return b.String()
}

// parseLogfmt splits a text line into its fields: bare values end at a space, quoted ones are JSON
// strings. A duplicate key fails the test.
func parseLogfmt(t *testing.T, line string) map[string]string {
	t.Helper()
	kv := map[string]string{}
	for len(line) > 0 {
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			t.Fatalf("no key=value at %q", line)
		}
		key := line[:eq]
		if strings.ContainsAny(key, " \"") {
			t.Fatalf("bad key %q", key)
		}
		line = line[eq+1:]
		var val string
		if strings.HasPrefix(line, `"`) {
			end := 1
			for ; end < len(line); end++ {
				if line[end] == '\\' {
					end++
				} else if line[end] == '"' {
					break
				}
			}
			if end >= len(line) {
				t.Fatalf("unterminated quoted value for %s", key)
			}
			if err := json.Unmarshal([]byte(line[:end+1]), &val); err != nil {
				t.Fatalf("value of %s %s: %s", key, line[:end+1], err)
			}
			line = line[end+1:]
		} else {
			end := strings.IndexByte(line, ' ')
			if end < 0 {
				end = len(line)
			}
			val, line = line[:end], line[end:]
		}
		if _, dup := kv[key]; dup {
			t.Fatalf("duplicate key %q", key)
		}
		kv[key] = val
		if len(line) > 0 {
			if line[0] != ' ' {
				t.Fatalf("no space after %s's value: %q", key, line)
			}
			line = line[1:]
		}
	}
	return kv
}

func TestRequestIDCut(t *testing.T) {
	var r Record
	long := strings.Repeat("x", MaxRequestID+10)
	r.SetRequestID([]byte(long))
	if string(r.RequestIDBytes()) != long[:MaxRequestID] {
		t.Fatalf("RequestIDBytes = %q; want the first %d bytes", r.RequestIDBytes(), MaxRequestID)
	}
	r.SetRequestID([]byte("short"))
	if string(r.RequestIDBytes()) != "short" {
		t.Fatalf("RequestIDBytes = %q; want short", r.RequestIDBytes())
	}
}
