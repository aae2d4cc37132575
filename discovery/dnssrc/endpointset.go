package dnssrc

import (
	"cmp"
	"slices"

	"github.com/rolter-ai/rolter/discovery"
)

// endpointSet is a set of endpoints in its one form: sorted by address, then name, each address once
// (DNS knows no UID, so the address is the endpoint's whole key). Two rounds that found the same engines
// give equal sets, whatever order the server listed them in.
type endpointSet []discovery.Endpoint

// newEndpointSet returns eps in a set's form; it sorts eps in place.
func newEndpointSet(eps []discovery.Endpoint) endpointSet {
	slices.SortFunc(eps, func(a, b discovery.Endpoint) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Name, b.Name))
	})
	return endpointSet(slices.CompactFunc(eps, func(a, b discovery.Endpoint) bool { return a.Key() == b.Key() }))
}

// equal reports whether s and o hold the same endpoints.
func (s endpointSet) equal(o endpointSet) bool { return slices.Equal(s, o) }

// forSink returns a copy of s for Sink.Set, which owns what it is given: nil for an empty set.
func (s endpointSet) forSink() []discovery.Endpoint {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}
