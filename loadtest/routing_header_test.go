package loadtest

import (
	"net/http"
	"testing"
)

func TestParseRoutingPrefixMatch(t *testing.T) {
	f := func(value string, want float64) {
		t.Helper()
		h := http.Header{}
		if value != "" {
			h.Set(PrefixMatchHeader, value)
		}
		if got := ParseRouting(h).PrefixMatch; got != want {
			t.Fatalf("%q: prefix match %v, want %v", value, got, want)
		}
	}
	f("0.8750", 0.875)
	f("0", 0)
	f("1.0000", 1)
	f("", -1)
	f("n/a", -1)
}
