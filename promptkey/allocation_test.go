//go:build !race

package promptkey

import (
	"strings"
	"testing"
)

// TestAllocsScanRequest pins the allocation contract of the request scan: validating a body and reading
// its model and prompt key allocate nothing once the key buffer and the model scratch have grown, whatever
// the body's size or number of values (no value tree: docs/architecture.md, "Request path").
func TestAllocsScanRequest(t *testing.T) {
	f := func(name, body string, ep Endpoint) {
		t.Helper()
		var s Scanner
		var info Info
		b := []byte(body)
		if e := s.Scan(b, ep, nil, &info); e != nil {
			t.Fatalf("%s: %s", name, e.Message)
		}
		key := info.Key
		if a := testing.AllocsPerRun(20, func() {
			if e := s.Scan(b, ep, key[:0], &info); e != nil {
				t.Fatal(e.Message)
			}
			key = info.Key
		}); a != 0 {
			t.Fatalf("%s: %v allocs per scan", name, a)
		}
	}
	for _, rb := range requestBodies {
		f(rb.name, rb.body, Chat)
	}
	f("token ids", `{"model":"m","prompt":[`+strings.Repeat("12345,", 100<<10)+`1]}`, Completions)
	f("escaped", `{"m\u006fdel":"caf\u00e9","messages":[{"content":[{"text":"a\nb","type":"text"}],"role":"user","role":"tool"}]}`, Chat)
	f("nested", `{"model":"m","input":`+strings.Repeat("[", 500)+strings.Repeat("]", 500)+`}`, Embeddings)
}

// TestAllocsScanShapes: the new request shapes, the identity prefix (fields moved into place, escaped
// values hashed past the key's end) and prompt_cache_key keep the scan's contract - no allocation once the
// key buffer and the scratch have grown.
func TestAllocsScanShapes(t *testing.T) {
	for _, sb := range shapeBodies {
		s := Scanner{KeyFields: []string{"user"}}
		var info Info
		b := []byte(sb.body)
		if e := s.Scan(b, sb.ep, nil, &info); e != nil {
			t.Fatalf("%s: %s", sb.name, e.Message)
		}
		key := info.Key
		if a := testing.AllocsPerRun(20, func() {
			if e := s.Scan(b, sb.ep, key[:0], &info); e != nil {
				t.Fatal(e.Message)
			}
			key = info.Key
		}); a != 0 {
			t.Fatalf("%s: %v allocs per scan", sb.name, a)
		}
	}
}
