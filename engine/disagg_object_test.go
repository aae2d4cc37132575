package engine

import (
	"testing"

	"github.com/rolter-ai/rolter/disagg"
	"github.com/rolter-ai/rolter/promptkey"
)

// FuzzDisaggObject: what the engine builds from the prompt scanner's one pass (where the body object ends,
// its members, the overridden keys) is exactly what disagg.Scan finds in a pass of its own, for every body
// the scanner accepts.
func FuzzDisaggObject(f *testing.F) {
	for _, b := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}  `,
		" \t{ \"model\" : \"m\" ,\"max_completion_tokens\":3, \"min_tokens\" :1,\"min_completion_tokens\":2}\n",
		`{"model":"m","min\u005ftokens":1,"stream_options":null,"x":{"min_tokens":1}}`,
		`{"model":"m","nested":{"stream_options":{}},"s":"}","max_completion_tokens":[1,{"a":"}"}]}`,
		"\xef\xbb\xbf{\"model\":\"m\"}",
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var s promptkey.Scanner
		var info promptkey.Info
		if e := s.Scan(body, promptkey.Chat, nil, &info); e != nil {
			return
		}
		want, err := disagg.Scan(body)
		if err != nil {
			if len(body) >= 3 && string(body[:3]) == "\xef\xbb\xbf" {
				return // a leading BOM: the prompt scanner skips it as Python does, disagg.Scan does not
			}
			t.Fatalf("the prompt scanner accepts %q, disagg.Scan refuses it: %s", body, err)
		}
		if got := disagg.NewObject(info.End, info.Members, disagg.Keys(info.Overrides)); got != want {
			t.Fatalf("body %q: from the prompt scan %+v, disagg.Scan %+v", body, got, want)
		}
	})
}
