package dnssrc

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/rolter-ai/rolter/discovery"
)

func TestEndpointSet(t *testing.T) {
	ep := func(name, addr string) discovery.Endpoint {
		return discovery.Endpoint{Name: name, Addr: netip.MustParseAddrPort(addr), Ready: true}
	}
	f := func(in, want []discovery.Endpoint) {
		t.Helper()
		got := newEndpointSet(slices.Clone(in))
		if !got.equal(endpointSet(want)) {
			t.Errorf("%v: %v, want %v", in, got, want)
		}
		if s := got.forSink(); len(got) == 0 && s != nil {
			t.Errorf("forSink of an empty set is %v, want nil", s)
		}
	}
	f(nil, nil)
	f([]discovery.Endpoint{ep("b", "10.0.0.2:1"), ep("a", "10.0.0.1:1")}, []discovery.Endpoint{ep("a", "10.0.0.1:1"), ep("b", "10.0.0.2:1")})
	f([]discovery.Endpoint{ep("a", "10.0.0.1:2"), ep("a", "10.0.0.1:1")}, []discovery.Endpoint{ep("a", "10.0.0.1:1"), ep("a", "10.0.0.1:2")})
	f([]discovery.Endpoint{ep("b", "10.0.0.1:1"), ep("a", "10.0.0.1:1"), ep("a", "10.0.0.1:1")}, []discovery.Endpoint{ep("a", "10.0.0.1:1")})
	f([]discovery.Endpoint{ep("a", "[fd00::1]:1"), ep("a", "10.0.0.1:1")}, []discovery.Endpoint{ep("a", "10.0.0.1:1"), ep("a", "[fd00::1]:1")})

	s := newEndpointSet([]discovery.Endpoint{ep("a", "10.0.0.1:1")})
	out := s.forSink()
	out[0].Name = "changed"
	if s[0].Name != "a" {
		t.Fatal("forSink shares its backing array with the set")
	}
}
