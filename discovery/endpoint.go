package discovery

import (
	"context"
	"net/netip"
)

// Endpoint is one engine a source sees: a pod behind a Service, a pod a selector or an InferencePool
// picks, or an address a DNS name resolves to.
type Endpoint struct {
	// Addr is where the engine serves its OpenAI API.
	Addr netip.AddrPort
	// UID identifies the engine behind Addr where the source knows it (a pod's UID; "" for DNS): a new pod
	// on a reused address is a new engine, with an empty trie and an untrusted KV stream.
	UID string
	// Name is what an operator knows the engine by (a pod name, an SRV target), for display only.
	Name string
	// Ready reports whether the engine takes new requests. An endpoint that is not ready (not yet, or any
	// longer: a terminating pod) is known but routed no new request; its streams finish.
	Ready bool
	// Terminating reports that the engine is going away (a pod being deleted), for display.
	Terminating bool
	// KVEvents and LMCache override the source's kv_events and lmcache endpoint templates for this engine
	// (from a pod annotation); "" uses the template.
	KVEvents string
	LMCache  string
}

// Key is the endpoint's identity: its address and the UID of the engine behind it.
func (e Endpoint) Key() Key { return Key{Addr: e.Addr, UID: e.UID} }

// Key identifies one engine: an address and, where the source knows it, the UID of what serves there.
type Key struct {
	Addr netip.AddrPort
	UID  string
}

// Sink takes what a Watcher sees. Its methods are safe to call from any goroutine and cheap: the Fleet
// coalesces what they report, so a watcher may call Set on every event it gets.
type Sink interface {
	// Set reports the whole set of endpoints the source sees now, ready or not. The slice is the
	// Sink's from then on: the watcher must not change it after the call.
	Set(eps []Endpoint)
	// Fail reports that the source cannot see its endpoints now (an API server or DNS server that does
	// not answer, an answer that does not parse); the last set stands until the next Set.
	Fail(err error)
}

// Watcher follows one source. Watch reports to sink until ctx is done, retrying with backoff whatever
// fails, and returns only then.
type Watcher interface {
	Watch(ctx context.Context, sink Sink)
}
