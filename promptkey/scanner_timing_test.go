package promptkey

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
)

// Sink keeps benchmark results alive.
var Sink atomic.Int64

// chat20 is a chat body of 20 messages (system prompt, 19 turns, ~8 KiB).
var chat20 = chatTurns(20)

// chatTurns returns a chat body of n messages: a system prompt, then user and assistant turns of ~370 bytes
// with array content.
func chatTurns(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","stream":true,"messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) + `"}`)
	for i := 1; i < n; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		fmt.Fprintf(&b, `,{"role":%q,"content":[{"type":"text","text":"turn %d: %s"}]}`, role, i, strings.Repeat("lorem ipsum \u00e9 ", 20))
	}
	b.WriteString(`],"max_tokens":128}`)
	return b.String()
}

// denseBody is 1 MiB of small values, the shape that costs a value tree the most per byte.
var denseBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"x":[` + strings.Repeat("1,", 512<<10-40) + `1]}`

// ascii8KiB is one user message of 8 KiB of English, escapes and all: the overhead report's cache_aware
// case.
var ascii8KiB = `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("The model answers a question about routing, cache and prefix. ", 130) + `"}],"max_tokens":8}`

// requestBodies are the bodies the request scanner is measured on.
var requestBodies = []struct {
	name string
	body string
}{
	{"chat8KiB", chat20},
	{"ascii8KiB", ascii8KiB},
	{"chat128KiB", chatTurns(353)},
	{"dense1MiB", denseBody},
}

// BenchmarkScanRequest measures validating a chat body and reading its model, stream flag and prompt key.
func BenchmarkScanRequest(b *testing.B) {
	for _, rb := range requestBodies {
		b.Run(rb.name, func(b *testing.B) {
			body := []byte(rb.body)
			var s Scanner
			var info Info
			s.Scan(body, Chat, nil, &info) // grows the key buffer
			key := info.Key
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := s.Scan(body, Chat, key[:0], &info); e != nil {
					b.Fatal(e.Message)
				}
				key = info.Key
			}
			Sink.Add(int64(len(info.Key)))
		})
	}
}

// shapeBodies are the request shapes besides chat the scanner is measured on: the other APIs' bodies, a salted
// one, and one whose parts come out of order (input before instructions: moved into place).
var shapeBodies = func() []struct {
	name string
	ep   Endpoint
	body string
} {
	var input, msgs strings.Builder
	for i := 1; i < 20; i++ {
		role, typ := "user", "input_text"
		if i%2 == 0 {
			role, typ = "assistant", "output_text"
		}
		if i > 1 {
			input.WriteByte(',')
			msgs.WriteByte(',')
		}
		text := fmt.Sprintf("turn %d: %s", i, strings.Repeat("lorem ipsum \u00e9 ", 20))
		fmt.Fprintf(&input, `{"type":"message","role":%q,"content":[{"type":%q,"text":%q}]}`, role, typ, text)
		fmt.Fprintf(&msgs, `{"role":%q,"content":[{"type":"text","text":%q}]}`, role, text)
	}
	system := strings.Repeat("You are a helpful assistant. ", 40)
	return []struct {
		name string
		ep   Endpoint
		body string
	}{
		{"responses8KiB", Responses, `{"model":"m","stream":true,"prompt_cache_key":"conv-\u0031","instructions":"` + system + `","input":[` + input.String() + `]}`},
		{"responsesReordered", Responses, `{"model":"m","input":[` + input.String() + `],"instructions":"` + system + `","cache_salt":"s\u00e9"}`},
		{"messages8KiB", Messages, `{"model":"m","max_tokens":128,"system":[{"type":"text","text":"` + system + `"}],"messages":[` + msgs.String() + `]}`},
		{"chatSalted8KiB", Chat, strings.Replace(chat20, `"model":"m"`, `"model":"m","cache_salt":"tenant-1","user":"alice"`, 1)},
	}
}()

// BenchmarkScanRequestShapes is BenchmarkScanRequest for the other request shapes (shapeBodies).
func BenchmarkScanRequestShapes(b *testing.B) {
	for _, sb := range shapeBodies {
		b.Run(sb.name, func(b *testing.B) {
			body := []byte(sb.body)
			s := Scanner{KeyFields: []string{"user"}}
			var info Info
			s.Scan(body, sb.ep, nil, &info)
			key := info.Key
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := s.Scan(body, sb.ep, key[:0], &info); e != nil {
					b.Fatal(e.Message)
				}
				key = info.Key
			}
			Sink.Add(int64(len(info.Key) + info.Opening))
		})
	}
}
