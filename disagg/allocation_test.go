//go:build !race

package disagg

import (
	"testing"
)

// The allocation contract: scanning a body, building every suffix into a buffer with room, parsing a
// prefill answer and drawing a room allocate nothing.
func TestAllocations(t *testing.T) {
	body := realisticChat()
	answer := []byte(answerChat)
	buf := make([]byte, 0, 4096)
	o, err := Scan(body)
	if err != nil {
		t.Fatal(err)
	}
	params, err := ParsePrefillAnswer(answer)
	if err != nil {
		t.Fatal(err)
	}
	f := func(name string, fn func()) {
		t.Helper()
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Fatalf("%s: %v allocations per run, want 0", name, n)
		}
	}
	f("Scan", func() { o, err = Scan(body) })
	f("AppendPrefill", func() { buf = AppendPrefill(buf[:0], o) })
	f("ParsePrefillAnswer", func() { params, err = ParsePrefillAnswer(answer) })
	f("ParsePrefillAnswer without params", func() { _, err = ParsePrefillAnswer(body) })
	f("AppendDecode", func() { buf = AppendDecode(buf[:0], o, params) })
	f("AppendBootstrap", func() { buf = AppendBootstrap(buf[:0], o, "fd00::17", 8998, NewRoom()) })
	f("whole prefill body", func() {
		buf = append(buf[:0], body[:o.End]...)
		buf = AppendPrefill(buf, o)
		buf = append(buf, body[o.End:]...)
	})
}
