package promptkey

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// scanJSONValid reports whether the scanner takes body as JSON: it may still refuse it as a request.
func scanJSONValid(body string, ep Endpoint) bool {
	var s Scanner
	var info Info
	e := s.Scan([]byte(body), ep, nil, &info)
	return e == nil || e.Code != "invalid_json"
}

// TestScanRequestJSON pins the JSON grammar to Python's json.loads on bytes (vLLM parses request bodies with
// it, through Starlette's Request.json): every row was checked with
// python3 -c 'import json,sys; json.loads(sys.stdin.buffer.read())' (3.11).
func TestScanRequestJSON(t *testing.T) {
	f := func(body string, valid bool) {
		t.Helper()
		if got := scanJSONValid(body, Chat); got != valid {
			t.Fatalf("scan(%q): valid JSON = %v, want %v", body, got, valid)
		}
	}
	// Values anywhere, including top-level scalars (refused later as "invalid_body").
	f(`{"model":"m"}`, true)
	f(`{}`, true)
	f(" \t\n\r{ \t\n\r\"a\" \t\n\r: \t\n\r1 \t\n\r} \t\n\r", true)
	f(`{"a":{"b":[{"c":null}],"d":[]},"e":{}}`, true)
	f(`[]`, true)
	f(`[1,"a",true,false,null,{},[]]`, true)
	f(`"x"`, true)
	f(`0`, true)
	f(`-0`, true)
	f(`0.5`, true)
	f(`-1.25e10`, true)
	f(`1E+5`, true)
	f(`1e-5`, true)
	f(`1e400`, true)
	f(`NaN`, true)
	f(`Infinity`, true)
	f(`-Infinity`, true)
	f(`[NaN,Infinity,-Infinity]`, true)
	f(`{"a":NaN}`, true)
	f(`true`, true)
	f(`null`, true)
	f(strings.Repeat("1", 4300), true)
	f("-"+strings.Repeat("1", 4300), true)
	f("1."+strings.Repeat("1", 5000), true)
	f("1e"+strings.Repeat("1", 5000), true)
	f(strings.Repeat("[", 512)+strings.Repeat("]", 512), true)
	// Strings.
	f(`"\"\\\/\b\f\n\r\t"`, true)
	f(`"\u00e9\u00E9"`, true)
	f(`"\uD834\uDD1E"`, true)
	f(`"\ud800"`, true)
	f(`"\udc00\ud800"`, true)
	f(`"\ud800\u0041"`, true)
	f(`"\u0000"`, true)
	f("\"é😀\"", true)
	f("\"\x7f\"", true)
	f("\"\xef\xbf\xbd\"", true)
	f("\xef\xbb\xbf{}", true)

	// Empty or nothing but whitespace or a BOM.
	f(``, false)
	f(" \n", false)
	f("\xef\xbb\xbf", false)
	f("\xef\xbb\xbf\xef\xbb\xbf{}", false)
	f("[\xef\xbb\xbf1]", false)
	// Literals and numbers Python refuses.
	f(`nan`, false)
	f(`inf`, false)
	f(`infinity`, false)
	f(`NAN`, false)
	f(`-NaN`, false)
	f(`+Infinity`, false)
	f(`True`, false)
	f(`NULL`, false)
	f(`nul`, false)
	f(`tru`, false)
	f(`+1`, false)
	f(`01`, false)
	f(`-01`, false)
	f(`.5`, false)
	f(`1.`, false)
	f(`1.e5`, false)
	f(`1e`, false)
	f(`1e+`, false)
	f(`-`, false)
	f(`--1`, false)
	f(`0x10`, false)
	f(`1_000`, false)
	f("\xd9\xa1", false) // an Arabic-Indic digit
	f(strings.Repeat("1", 4301), false)
	f("-"+strings.Repeat("1", 4301), false)
	// Structure.
	f(`{"a":1,}`, false)
	f(`[1,]`, false)
	f(`{,}`, false)
	f(`[,1]`, false)
	f(`{"a" 1}`, false)
	f(`{"a":}`, false)
	f(`{a:1}`, false)
	f(`{'a':1}`, false)
	f(`{1:1}`, false)
	f(`{"a":1 "b":2}`, false)
	f(`[1 2]`, false)
	f(`[1,2`, false)
	f(`{"a":1`, false)
	f(`{"a"`, false)
	f(`{`, false)
	f(`]`, false)
	f(`{}x`, false)
	f(`{} {}`, false)
	f(`[]]`, false)
	f(`{}}`, false)
	f("{}\x0c", false)
	f("\x0c{}", false)
	f("[\x0c1]", false)
	f("{}\x00", false)
	f("{\"a\":1}\xa0", false)
	// Strings Python refuses in strict mode, and bytes it cannot decode.
	f(`"abc`, false)
	f(`"\`, false)
	f(`"\u12"`, false)
	f(`"\u12G4"`, false)
	f(`"\u 123"`, false)
	f(`"\u+123"`, false)
	f(`"\ud800\uzzzz"`, false)
	f(`"\x6d"`, false)
	f(`"\a"`, false)
	f(`"\U0041"`, false)
	f(`"\'"`, false)
	f(`"\0"`, false)
	f("\"\x00\"", false)
	f("\"\x1f\"", false)
	f("\"\t\"", false)
	f("\"\n\"", false)
	f("\"\xff\"", false)
	f("\"\xc3\"", false)
	f("\"\xc3(\"", false)
	f("\"\xc0\xaf\"", false)
	f("\"\xe2\x82\"", false)
	f("\"\xf4\x90\x80\x80\"", false)
	f("\"\xf0\x9f\x98\"", false)
}

// TestScanRequestPythonDifferences pins the bodies Python's json.loads takes and the scanner refuses.
func TestScanRequestPythonDifferences(t *testing.T) {
	f := func(body string) {
		t.Helper()
		if scanJSONValid(body, Chat) {
			t.Fatalf("scan(%q) took a body it documents refusing", body)
		}
	}
	// Nesting: Python goes to its recursion limit (~990 levels at the default 1000).
	f(strings.Repeat("[", 513) + strings.Repeat("]", 513))
	f(`{"model":"m","a":` + strings.Repeat("[", 512) + strings.Repeat("]", 512) + "}")
	f(`{"model":"m","prompt":` + strings.Repeat("[", 512) + strings.Repeat("]", 512) + "}")
	// json.loads decodes bytes with errors="surrogatepass": UTF-8-encoded surrogates are taken.
	f("\"\xed\xa0\x80\"")
	// json.loads detects UTF-16 and UTF-32 bodies; vLLM's clients send UTF-8.
	f("\xff\xfe{\x00}\x00")
	f("{\x00}\x00")
}

// TestScanRequestDepth: 512 levels of nesting are taken and 513 refused on every path through the scanner
// (the top-level object is level 1).
func TestScanRequestDepth(t *testing.T) {
	f := func(ep Endpoint, prefix string, levels int, suffix string) {
		t.Helper()
		for _, n := range []int{levels, levels + 1} {
			body := prefix + strings.Repeat("[", n) + strings.Repeat("]", n) + suffix
			if got, want := scanJSONValid(body, ep), n == levels; got != want {
				t.Fatalf("%d levels after %s: valid JSON = %v, want %v", n, prefix, got, want)
			}
		}
	}
	f(Chat, ``, 512, ``)
	f(Chat, `{"model":"m","x":`, 511, `}`)
	f(Chat, `{"model":"m","messages":`, 511, `}`)
	f(Chat, `{"model":"m","messages":[`, 510, `]}`)
	f(Chat, `{"model":"m","messages":[{"role":`, 509, `}]}`)
	f(Chat, `{"model":"m","messages":[{"role":"u","content":`, 509, `}]}`)
	f(Chat, `{"model":"m","messages":[{"content":`, 509, `,"role":"u"}]}`)
	f(Chat, `{"model":"m","messages":[{"role":"u","content":[`, 508, `]}]}`)
	f(Chat, `{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":`, 507, `}]}]}`)
	f(Chat, `{"model":"m","messages":[{"role":"u","content":[{"type":`, 507, `,"text":"a"}]}]}`)
	f(Completions, `{"model":"m","prompt":`, 511, `}`)
	f(Completions, `{"model":"m","prompt":[1,"a",`, 510, `]}`)
	f(Embeddings, `{"model":"m","input":[[{"a":`, 508, `}]]}`)
	f(Responses, `{"model":"m","instructions":`, 511, `}`)
	f(Responses, `{"model":"m","instructions":[`, 510, `]}`)
	f(Responses, `{"model":"m","instructions":[{"type":"input_text","text":`, 509, `}]}`)
	f(Responses, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":`, 507, `}]}]}`)
	f(Messages, `{"model":"m","system":[{"type":`, 509, `,"text":"a"}]}`)
	f(Messages, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":`, 507, `}]}]}`)
	f(Other, `{"model":"m","messages":[{"role":"user","content":[`, 508, `]}]}`)
}

func TestScanRequestErrors(t *testing.T) {
	f := func(body, code, message string) {
		t.Helper()
		var s Scanner
		var info Info
		e := s.Scan([]byte(body), Chat, nil, &info)
		if e == nil {
			t.Fatalf("scan(%q) = nil, want %s", body, code)
		}
		if e.Code != code || e.Message != message {
			t.Fatalf("scan(%q) = %s %q, want %s %q", body, e.Code, e.Message, code, message)
		}
	}
	const p = "cannot parse the request body as JSON: "
	f(``, "invalid_json", p+"unexpected end of input at byte 0")
	f(`{"model":"m",`, "invalid_json", p+"unexpected end of input at byte 13")
	f(`{"model":"m" "x"}`, "invalid_json", p+"expected ',' or '}' at byte 13")
	f(`[1 2]`, "invalid_json", p+"expected ',' or ']' at byte 3")
	f(`{"model" "m"}`, "invalid_json", p+"expected ':' after an object key at byte 9")
	f(`{secret:1}`, "invalid_json", p+"expected a string key at byte 1")
	f(`{"model":secret}`, "invalid_json", p+"expected a value at byte 9")
	f(`{"model":nan}`, "invalid_json", p+"invalid literal at byte 9")
	f(`{"model":01}`, "invalid_json", p+"expected ',' or '}' at byte 10")
	f(`{"model":1.}`, "invalid_json", p+"invalid number at byte 9")
	f(`{"model":"\x6dodel"}`, "invalid_json", p+"invalid escape at byte 10")
	f(`{"\x6dodel":"m"}`, "invalid_json", p+"invalid escape at byte 2")
	f(`{"model":"\u00zz"}`, "invalid_json", p+"invalid \\u escape at byte 10")
	f("{\"model\":\"a\nb\"}", "invalid_json", p+"control character in a string at byte 11")
	f("{\"model\":\"\xff\"}", "invalid_json", p+"invalid UTF-8 at byte 10")
	f(`{"model":"m"} x`, "invalid_json", p+"unexpected data after the top-level value at byte 14")
	f(`{"a":`+strings.Repeat("[", 512)+strings.Repeat("]", 512)+`}`, "invalid_json", p+"nesting deeper than 512 at byte 516")
	f(`{"a":`+strings.Repeat("1", 4301)+`}`, "invalid_json", p+"integer with more than 4300 digits at byte 5")
	// A parse error anywhere wins over what the body says about the model.
	f(`{"model":1,"model":2,}`, "invalid_json", p+"expected a string key at byte 21")
	f(`[1,2]`, "invalid_body", "the request body must be a JSON object")
	f(`"text"`, "invalid_body", "the request body must be a JSON object")
	f(`NaN`, "invalid_body", "the request body must be a JSON object")
	f(`{"messages":[{"model":"m"}]}`, "missing_model", "you must provide a model parameter")
	f(`{"modeL":"m"}`, "missing_model", "you must provide a model parameter")
	f(`{"model":42}`, "invalid_model", "the model parameter must be a string")
	f(`{"model":null}`, "invalid_model", "the model parameter must be a string")
	f(`{"model":["m"]}`, "invalid_model", "the model parameter must be a string")
	const dup = "the request body has more than one \"model\" key"
	f(`{"model":"m","model":"other"}`, "duplicate_model", dup)
	f(`{"model":"m","model":"m"}`, "duplicate_model", dup)
	f(`{"model":"m","x":1,"model":2}`, "duplicate_model", dup)
	f(`{"model":"m","\u006dodel":"other"}`, "duplicate_model", dup)
	f(`{"model":"m","mod\u0065l":"other"}`, "duplicate_model", dup)
	f(`{"\u006D\u006F\u0064\u0065\u006C":"m","model":"other"}`, "duplicate_model", dup)
}

func TestScanRequestModel(t *testing.T) {
	f := func(body, model, span string) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(body), Chat, nil, &info); e != nil {
			t.Fatalf("scan(%q): %s", body, e.Message)
		}
		if string(info.Model) != model || body[info.ModelStart:info.ModelEnd] != span {
			t.Fatalf("scan(%q): model %q span %q, want %q %q", body, info.Model, body[info.ModelStart:info.ModelEnd], model, span)
		}
		// Splicing another model into the span gives a valid body with that model and the same prompt key.
		key := string(info.Key)
		spliced := body[:info.ModelStart] + `"other"` + body[info.ModelEnd:]
		if e := s.Scan([]byte(spliced), Chat, nil, &info); e != nil {
			t.Fatalf("scan(%q): %s", spliced, e.Message)
		}
		if string(info.Model) != "other" || string(info.Key) != key || !json.Valid([]byte(strings.TrimPrefix(spliced, "\xef\xbb\xbf"))) {
			t.Fatalf("spliced %q: model %q key %q, want other %q", spliced, info.Model, info.Key, key)
		}
	}
	f(`{"model":"m"}`, "m", `"m"`)
	f(` { "x" : {"model":"inner"}, "model" : "a\"b" , "y":[1,{"model":2}]}`, `a"b`, `"a\"b"`)
	f(`{"messages":[{"role":"user","content":"hi"}],"model":"llama-3"}`, "llama-3", `"llama-3"`)
	f(`{"mod\u0065l":"escaped"}`, "escaped", `"escaped"`)
	f(`{"\u006dodel":"caf\u00e9"}`, "café", `"caf\u00e9"`)
	f(`{"model":"\ud83d\ude00 \ud800"}`, "😀 \ufffd", `"\ud83d\ude00 \ud800"`)
	f("\xef\xbb\xbf{\"model\":\"m\"}", "m", `"m"`)
	f(`{"model":""}`, "", `""`)
	// Keys that are not "model" under JSON's escape rules.
	f(`{"model ":"x","Model":"y","model":"m","\"model\"":"z"}`, "m", `"m"`)
}

// TestScanRequestShrink: a scanner keeps its model scratch for the next scan unless it grew too large.
func TestScanRequestShrink(t *testing.T) {
	f := func(escaped, want string, kept bool) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(`{"model":"`+escaped+`"}`), Chat, nil, &info); e != nil {
			t.Fatal(e.Message)
		}
		s.Shrink(1024)
		if string(info.Model) != want || (s.model != nil) != kept {
			t.Fatalf("model %q, scratch kept %v; want %q, %v", info.Model, s.model != nil, want, kept)
		}
	}
	f(`caf\u00e9`, "café", true)
	f(strings.Repeat(`\u00e9`, 1000), strings.Repeat("é", 1000), false)
	f("café", "café", false) // no escapes: the model aliases the body
}

func TestScanRequestStream(t *testing.T) {
	f := func(body string, want bool) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(body), Chat, nil, &info); e != nil {
			t.Fatalf("scan(%q): %s", body, e.Message)
		}
		if info.Stream != want {
			t.Fatalf("scan(%q): stream %v, want %v", body, info.Stream, want)
		}
	}
	f(`{"model":"m"}`, false)
	f(`{"model":"m","stream":true}`, true)
	f(`{"model":"m","stream":false}`, false)
	f(`{"model":"m","stream":"true"}`, false)
	f(`{"model":"m","stream":1}`, false)
	f(`{"model":"m","stream":[true]}`, false)
	f(`{"model":"m","stream":true,"stream":false}`, false)
	f(`{"model":"m","stream":false,"str\u0065am":true}`, true)
	f(`{"model":"m","x":{"stream":true}}`, false)
}

// TestScanRequestMaxTokens: the last max_tokens, max_completion_tokens or max_output_tokens that is a
// plain non-negative integer is the answer's bound; any other value is none.
func TestScanRequestMaxTokens(t *testing.T) {
	f := func(body string, want int64) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(body), Chat, nil, &info); e != nil {
			t.Fatalf("scan(%q): %s", body, e.Message)
		}
		if info.MaxTokens != want {
			t.Fatalf("scan(%q): max tokens %d, want %d", body, info.MaxTokens, want)
		}
	}
	f(`{"model":"m"}`, 0)
	f(`{"model":"m","max_tokens":256}`, 256)
	f(`{"model":"m","max_completion_tokens": 17 }`, 17)
	f(`{"model":"m","max_output_tokens":0}`, 0)
	f(`{"model":"m","max_tokens":12,"max_completion_tokens":99}`, 99)
	f(`{"model":"m","max_tok\u0065ns":42}`, 42)
	f(`{"model":"m","max_tokens":-1}`, 0)
	f(`{"model":"m","max_tokens":1.5}`, 0)
	f(`{"model":"m","max_tokens":1e3}`, 0)
	f(`{"model":"m","max_tokens":"100"}`, 0)
	f(`{"model":"m","max_tokens":9007199254740993}`, 0)
	f(`{"model":"m","max_tokens":null}`, 0)
	f(`{"model":"m","x":{"max_tokens":5}}`, 0)
}

// promptKeyCases are bodies with the prompt key each gives. The ones before "new:" are the cases the earlier
// (fastjson-based) implementation was tested on; the key is unchanged on them.
func promptKeyCases(f func(body string, ep Endpoint, want string)) {
	f(`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, Chat, "system\x1fbe brief\x1euser\x1fhi\x1e")
	// Escaped and unescaped spellings give the same key.
	f(`{"messages":[{"role":"user","content":"caf\u00e9 \"x\""}]}`, Chat, "user\x1fcafé \"x\"\x1e")
	f(`{"messages":[{"role":"user","content":"café \"x\""}]}`, Chat, "user\x1fcafé \"x\"\x1e")
	// Text parts in order; images are not text.
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"text","text":"b"}]}]}`, Chat, "user\x1fab\x1e")
	// Assistant tool calls have null content.
	f(`{"messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`, Chat, "assistant\x1f\x1e")
	f(`{"prompt":"once upon"}`, Completions, "once upon")
	f(`{"prompt":["a","b"]}`, Completions, "a\x1eb\x1e")
	f(`{"prompt":[1,2,3]}`, Completions, "1,2,3,")
	f(`{"input":"embed me"}`, Embeddings, "embed me")
	// new: escaped spellings of keys and of the "text" type.
	f(`{"m\u0065ssages":[{"\u0072ole":"us\u0065r","c\u006fntent":[{"\u0074ype":"t\u0065xt","t\u0065xt":"a\nb\/c"}]}]}`, Chat, "user\x1fa\nb/c\x1e")
	f(`{"messages":[{"role":"user","content":"\ud83d\ude00\ud800\udc00 \ud800x \udfff"}]}`, Chat, "user\x1f😀\U00010000 \ufffdx \ufffd\x1e")
	f(`{"messages":[{"role":"user","content":"\u0000\u001f\b\f\t"}]}`, Chat, "user\x1f\x00\x1f\b\f\t\x1e")
	// The last "role" and "content" count, in whichever order.
	f(`{"messages":[{"content":"hi","role":"user"}]}`, Chat, "user\x1fhi\x1e")
	f(`{"messages":[{"content":[{"text":"a","type":"text"}],"name":"x","role":"user"}]}`, Chat, "user\x1fa\x1e")
	f(`{"messages":[{"role":"user","content":"a","content":"b"}]}`, Chat, "user\x1fb\x1e")
	f(`{"messages":[{"role":"user","content":"a","role":"tool"}]}`, Chat, "tool\x1fa\x1e")
	f(`{"messages":[{"role":"user","role":"system","content":"a"}]}`, Chat, "system\x1fa\x1e")
	f(`{"messages":[{"role":"user","content":"a","content":null}]}`, Chat, "user\x1f\x1e")
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}],"content":"b","role":"x"}]}`, Chat, "x\x1fb\x1e")
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"},{"type":"text","text":"c","type":"image_url"},{"type":"image_url","type":"text","text":"d"}]}]}`, Chat, "user\x1fbd\x1e")
	f(`{"messages":[{"role":"user","content":[{"text":"a","type":"text","text":"b"},{"text":1,"type":"text"}]}]}`, Chat, "user\x1fb\x1e")
	// The last "messages" counts.
	f(`{"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]}`, Chat, "user\x1fb\x1e")
	f(`{"messages":[{"role":"user","content":"a"}],"messages":null}`, Chat, "")
	// Shapes that do not match add nothing, but each message still ends.
	f(`{"messages":{"role":"user","content":"a"}}`, Chat, "")
	f(`{"messages":[]}`, Chat, "")
	f(`{"messages":[{}]}`, Chat, "\x1f\x1e")
	f(`{"messages":[null,1,"x",[{"role":"user"}]]}`, Chat, "\x1f\x1e\x1f\x1e\x1f\x1e\x1f\x1e")
	f(`{"messages":[{"role":1,"content":{"text":"a"}}]}`, Chat, "\x1f\x1e")
	f(`{"messages":[{"role":"user"}]}`, Chat, "user\x1f\x1e")
	f(`{"messages":[{"content":"a"}]}`, Chat, "\x1fa\x1e")
	f(`{"messages":[{"role":"user","content":["a",null,{"type":"text"},{"type":"text","text":["b"]},{"type":["text"],"text":"c"}]}]}`, Chat, "user\x1f\x1e")
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"a","extra":{"text":"b","type":"text"}}]}]}`, Chat, "user\x1fa\x1e")
	f(`{"prompt":"a","messages":[{"role":"user","content":"b"}],"input":"c"}`, Chat, "user\x1fb\x1e")
	// Completions and embeddings.
	f(`{"prompt":"a","messages":[{"role":"user","content":"b"}],"input":"c"}`, Completions, "a")
	f(`{"prompt":"a","messages":[{"role":"user","content":"b"}],"input":"c"}`, Embeddings, "c")
	f(`{"prompt":"a","prompt":["b"]}`, Completions, "b\x1e")
	f(`{"prompt":["a\u00e9",[1,2],[["b"]],[],{"x":"y"},null,true]}`, Completions, "aé\x1e1,2,\x1eb\x1e\x1e\x1e\x1e\x1e\x1e\x1e")
	f(`{"prompt":[-7,0,-0,9223372036854775807,-9223372036854775808,9223372036854775808,1.5,1e3,NaN,Infinity,-Infinity]}`, Completions,
		"-7,0,0,9223372036854775807,-9223372036854775808,0,0,0,0,0,0,")
	f(`{"prompt":{"text":"a"}}`, Completions, "")
	f(`{"prompt":5}`, Completions, "")
	f(`{"input":[[1,2],[3]]}`, Embeddings, "1,2,\x1e3,\x1e")
	f(`{"input":[]}`, Embeddings, "")
	// Responses: instructions as a system message, then input - a string is a user message, items are
	// messages (input_text and output_text parts are text; items without a role add an empty one).
	const chatKey = "system\x1fbe brief\x1euser\x1fhi\x1e"
	f(`{"instructions":"be brief","input":"hi"}`, Responses, chatKey)
	f(`{"input":"hi","instructions":"be brief"}`, Responses, chatKey)
	f(`{"instructions":"be brief","input":[{"role":"user","content":"hi"}]}`, Responses, chatKey)
	f(`{"input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"h"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"i"}]}],"instructions":"be brief"}`, Responses, chatKey)
	f(`{"input":[{"role":"user","content":"q"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a"}]},{"type":"function_call","call_id":"c","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}]}`, Responses,
		"user\x1fq\x1eassistant\x1fa\x1e\x1f\x1e\x1f\x1e")
	f(`{"instructions":null,"input":"hi","messages":[{"role":"user","content":"x"}],"system":"s"}`, Responses, "user\x1fhi\x1e")
	f(`{"instructions":"a","input":"b","instructions":"c","input":"d"}`, Responses, "system\x1fc\x1euser\x1fd\x1e")
	f(`{"input":"b","instructions":"a","input":"d","instructions":"c"}`, Responses, "system\x1fc\x1euser\x1fd\x1e")
	f(`{"instructions":"a","input":"b","instructions":null}`, Responses, "user\x1fb\x1e")
	f(`{"instructions":"be brief"}`, Responses, "system\x1fbe brief\x1e")
	f(`{"input":5,"instructions":{"text":"a"}}`, Responses, "")
	// Messages (Anthropic): system (a string or text blocks), then messages as chat.
	f(`{"system":"be brief","messages":[{"role":"user","content":"hi"}]}`, Messages, chatKey)
	f(`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"system":[{"type":"text","text":"be ","cache_control":{"type":"ephemeral"}},{"type":"text","text":"brief"}]}`, Messages, chatKey)
	f(`{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"r"},{"type":"text","text":"q"}]}]}`, Messages, "user\x1fq\x1e")
	f(`{"system":"a","messages":[{"role":"user","content":"b"}],"system":"c","messages":[]}`, Messages, "system\x1fc\x1e")
	// Chat has no system field; other endpoints have no key.
	f(`{"system":"s","instructions":"i","messages":[{"role":"user","content":"hi"}]}`, Chat, "user\x1fhi\x1e")
	f(`{"messages":[{"role":"user","content":"a"}],"prompt":"b","input":"c","query":"d"}`, Other, "")
}

func TestPromptKey(t *testing.T) {
	f := func(body string, ep Endpoint, want string) {
		t.Helper()
		var s Scanner
		var info Info
		body = strings.Replace(body, "{", `{"model":"m",`, 1)
		dst := []byte("prefix:")
		if e := s.Scan([]byte(body), ep, dst, &info); e != nil {
			t.Fatalf("scan(%s): %s", body, e.Message)
		}
		if got := string(info.Key); got != "prefix:"+want {
			t.Fatalf("scan(%s): key %q, want %q", body, got, "prefix:"+want)
		}
		// The key does not depend on where "model" is or on the whitespace around values.
		spaced := respace(strings.Replace(body, `"model":"m",`, "", 1))
		spaced = strings.TrimRight(spaced, " \t\n")
		spaced = spaced[:len(spaced)-1] + `, "model" : "m" }`
		if e := s.Scan([]byte(spaced), ep, nil, &info); e != nil || string(info.Key) != want {
			t.Fatalf("scan(%q): key %q, %v; want %q", spaced, info.Key, e, want)
		}
	}
	promptKeyCases(f)
}

// respace adds JSON whitespace around the structural bytes of the valid JSON body.
func respace(body string) string {
	var b strings.Builder
	in := false
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case in && c == '\\':
			b.WriteByte(c)
			i++
			c = body[i]
		case c == '"':
			in = !in
		case !in && strings.IndexByte(",:[]{}", c) >= 0:
			b.WriteString(" \t")
			b.WriteByte(c)
			c = '\n'
		}
		b.WriteByte(c)
	}
	return b.String()
}

// TestScanPlainEnd checks the word-at-a-time string check against utf8.DecodeRune: every sequence of interest at
// every offset of runs of ASCII and of 2-byte text, in both word alignments.
func TestScanPlainEnd(t *testing.T) {
	want := func(b []byte, i, e int) int {
		for i < e {
			if b[i] < 0x20 {
				return i
			}
			r, n := utf8.DecodeRune(b[i:e])
			if r == utf8.RuneError && n == 1 {
				return i
			}
			i += n
		}
		return e
	}
	seqs := []string{"a", "\x00", "\x1f", "\x7f", "é", "\u07ff", "\u0800", "€", "\uffff", "😀", "\U0010ffff",
		"\xc0\x80", "\xc1\xbf", "\xc2", "\xdf", "\x80", "\xbf", "\xe0\x80\x80", "\xe0\xa0", "\xed\xa0\x80", "\xf0\x8f\xbf\xbf",
		"\xf4\x90\x80\x80", "\xf5\x80\x80\x80", "\xff", "é\xa9", "\xc3\xc3\xa9", "\xe2\x82\xac\xac"}
	for _, fill := range []string{"x", "é", "ab€"} {
		for n := 0; n < 80; n++ {
			base := strings.Repeat(fill, n)
			for _, seq := range seqs {
				for p := 0; p <= len(base); p++ {
					b := []byte("\"" + base[:p] + seq + base[p:] + "\"")
					for _, i := range []int{1, 2} {
						if i >= len(b)-1 {
							continue
						}
						e := len(b) - 1
						if got, want := plainEnd(b, i, e), want(b, i, e); got != want {
							t.Fatalf("plainEnd(%q, %d, %d) = %d, want %d", b, i, e, got, want)
						}
					}
				}
			}
		}
	}
}

// TestScanOpening: the opening is the key up to the end of the first user message - system messages and
// whatever came before it included - or the whole key without one.
func TestScanOpening(t *testing.T) {
	f := func(body string, ep Endpoint, want string) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(body), ep, []byte("dst:"), &info); e != nil {
			t.Fatalf("scan(%s): %s", body, e.Message)
		}
		key := info.Key[len("dst:"):]
		if got := string(key[:info.Opening]); got != want {
			t.Fatalf("scan(%s): opening %q, want %q (key %q)", body, got, want, key)
		}
	}
	f(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}`, Chat,
		"system\x1fs\x1euser\x1fq1\x1e")
	f(`{"model":"m","messages":[{"role":"developer","content":"s"},{"role":"assistant","content":"hello"},{"content":"q1","role":"user"},{"role":"user","content":"q2"}]}`, Chat,
		"developer\x1fs\x1eassistant\x1fhello\x1euser\x1fq1\x1e")
	f(`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"users","content":"x"}]}`, Chat, "system\x1fs\x1eusers\x1fx\x1e")
	f(`{"model":"m","messages":[{"role":"user","content":"a"}],"messages":[{"role":"system","content":"s"}]}`, Chat, "system\x1fs\x1e")
	f(`{"model":"m","prompt":"a long prompt"}`, Completions, "a long prompt")
	f(`{"model":"m","messages":[]}`, Chat, "")
	f(`{"model":"m","input":"q","instructions":"s"}`, Responses, "system\x1fs\x1euser\x1fq\x1e")
	f(`{"model":"m","input":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}],"instructions":"s"}`, Responses,
		"system\x1fs\x1euser\x1fq1\x1e")
	f(`{"model":"m","messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"}],"system":"s"}`, Messages, "system\x1fs\x1euser\x1fq1\x1e")
	f(`{"model":"m","input":"q","instructions":"s","input":[{"role":"assistant","content":"a"}]}`, Responses, "system\x1fs\x1eassistant\x1fa\x1e")
}

// TestScanIdentity: the identity prefix - cache_salt and the key fields - keeps requests the engine caches
// apart from sharing any prefix, and the ones it caches together sharing theirs; it does not depend on
// spelling or order, and a body without a conversation gets no prefix (it would be a full match).
func TestScanIdentity(t *testing.T) {
	scan := func(body string, ep Endpoint) (key []byte, opening int) {
		t.Helper()
		s := Scanner{KeyFields: []string{"user", "tenant"}}
		var info Info
		if e := s.Scan([]byte(body), ep, nil, &info); e != nil {
			t.Fatalf("scan(%s): %s", body, e.Message)
		}
		return info.Key, info.Opening
	}
	const conv = `"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]`
	const plain = "system\x1fs\x1euser\x1fq\x1eassistant\x1fa\x1e"
	// same reports whether two bodies get the same key; either way the conversation follows the prefix.
	same := func(a, b string) bool {
		t.Helper()
		ka, oa := scan(a, Chat)
		kb, ob := scan(b, Chat)
		for _, k := range [][]byte{ka, kb} {
			if string(k) != plain && (len(k) != identityLen+len(plain) || k[0] != keyIdentity || string(k[identityLen:]) != plain) {
				t.Fatalf("key %q: want the conversation after an identity prefix or none", k)
			}
		}
		if oa != len(ka)-len("assistant\x1fa\x1e") || ob != len(kb)-len("assistant\x1fa\x1e") {
			t.Fatalf("openings %d, %d of keys %q, %q", oa, ob, ka, kb)
		}
		return string(ka) == string(kb)
	}
	f := func(a, b string, want bool) {
		t.Helper()
		a, b = `{"model":"m",`+conv+a+`}`, `{"model":"m",`+conv+b+`}`
		if got := same(a, b); got != want {
			t.Fatalf("%s\n%s\nsame key = %v, want %v", a, b, got, want)
		}
	}
	f(``, ``, true)
	f(``, `,"cache_salt":null,"user":null`, true)
	f(``, `,"cache_salt":"s1"`, false)
	f(`,"cache_salt":"s1"`, `,"cache_salt":"s1"`, true)
	f(`,"cache_salt":"s1"`, `,"cache_salt":"s2"`, false)
	f(`,"cache_salt":"s1"`, `,"cache_salt":"\u0073\u0031"`, true)
	f(`,"cache_salt":"s2","cache_salt":"s1"`, `,"cache_salt":"s1"`, true)
	f(`,"user":"alice"`, `,"user":"bob"`, false)
	f(`,"user":"alice"`, `,"user":"alice","other":"x"`, true)
	f(`,"user":"alice","tenant":"t"`, `,"tenant":"t","user":"alice"`, true)
	f(`,"user":"x"`, `,"tenant":"x"`, false)
	f(`,"user":"x","tenant":"y"`, `,"user":"y","tenant":"x"`, false)
	f(`,"user":"alice","cache_salt":"s"`, `,"user":"alice"`, false)
	f(`,"user":1`, `,"user":"1"`, false)
	f(`,"user":{"id":1}`, `,"user":{"id":1}`, true)
	f(`,"User":"alice"`, ``, true)
	// The identity goes first whatever the order of the body.
	k1, _ := scan(`{"cache_salt":"s","model":"m",`+conv+`}`, Chat)
	k2, _ := scan(`{"model":"m",`+conv+`,"cache_salt":"s"}`, Chat)
	if string(k1) != string(k2) {
		t.Fatalf("keys differ by field order: %q, %q", k1, k2)
	}
	// No conversation, no prefix.
	if k, o := scan(`{"model":"m","cache_salt":"s","messages":[]}`, Chat); len(k) != 0 || o != 0 {
		t.Fatalf("empty conversation: key %q opening %d", k, o)
	}
	if k, _ := scan(`{"model":"m","cache_salt":"s","query":"q"}`, Other); len(k) != 0 {
		t.Fatalf("other endpoint: key %q", k)
	}
	// Every shape takes the prefix, in front of its system message.
	k, o := scan(`{"model":"m","input":"q","cache_salt":"s","instructions":"i"}`, Responses)
	if k[0] != keyIdentity || string(k[identityLen:]) != "system\x1fi\x1euser\x1fq\x1e" || o != len(k) {
		t.Fatalf("responses: key %q opening %d", k, o)
	}
}

// TestScanSession: prompt_cache_key is read when it is a string (the last one), unescaped.
func TestScanSession(t *testing.T) {
	f := func(body string, want string, ok bool) {
		t.Helper()
		var s Scanner
		var info Info
		if e := s.Scan([]byte(body), Chat, nil, &info); e != nil {
			t.Fatalf("scan(%s): %s", body, e.Message)
		}
		if string(info.Session) != want || (info.Session != nil) != ok {
			t.Fatalf("scan(%s): session %q (%v), want %q (%v)", body, info.Session, info.Session != nil, want, ok)
		}
	}
	f(`{"model":"m"}`, "", false)
	f(`{"model":"m","prompt_cache_key":"conv-1"}`, "conv-1", true)
	f(`{"prompt_cache_key":"conv-1","model":"m","messages":[]}`, "conv-1", true)
	f(`{"model":"m","prompt_cache_key":"caf\u00e9"}`, "café", true)
	f(`{"model":"m","prompt_cache_key":"a","prompt_cache_key":"b"}`, "b", true)
	f(`{"model":"m","prompt_cache_key":""}`, "", true)
	f(`{"model":"m","prompt_cache_key":null}`, "", false)
	f(`{"model":"m","prompt_cache_key":7}`, "", false)
	f(`{"model":"m","prompt_cache_key":"a","prompt_cache_key":7}`, "", false)
	f(`{"model":"m","x":{"prompt_cache_key":"a"}}`, "", false)
}

// TestPlainRun: plainRun stops at the first byte that is not printable ASCII or is '"' or '\\', at every
// position of runs long enough for the vector blocks and their tails, for every byte value, with and
// without the vector version (where the CPU has it).
func TestPlainRun(t *testing.T) {
	want := func(b []byte) int {
		for i, c := range b {
			if c < 0x20 || c >= 0x80 || c == '"' || c == '\\' {
				return i
			}
		}
		return len(b)
	}
	base := make([]byte, 200)
	for i := range base {
		base[i] = byte(0x20 + i%95)
		if base[i] == '"' || base[i] == '\\' {
			base[i] = 'x'
		}
	}
	vector := haveAVX2
	defer func() { haveAVX2 = vector }()
	for _, v := range []bool{false, vector} {
		haveAVX2 = v
		for n := 0; n <= len(base); n++ {
			b := base[:n]
			if got := plainRun(b); got != n {
				t.Fatalf("vector %v: plainRun(%d plain bytes) = %d", v, n, got)
			}
			for p := 0; p < n; p++ {
				for c := 0; c < 256; c++ {
					old := b[p]
					b[p] = byte(c)
					if got, w := plainRun(b), want(b); got != w {
						t.Fatalf("vector %v, n %d, byte %#x at %d: plainRun = %d, want %d", v, n, c, p, got, w)
					}
					b[p] = old
				}
			}
		}
	}
}
