package dnssrc

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"golang.org/x/net/dns/dnsmessage"
)

// Bounds of one round's work.
const (
	// maxSRVTargets bounds the SRV targets one round follows (each may cost two queries); targets past
	// it, in the answer's order, are left out and logged.
	maxSRVTargets = 256
	// roundTimeouts is how many of the source's timeouts one round may take in all: a server that lists
	// many targets and answers each query just in time still fails the round in bounded time.
	roundTimeouts = 8
)

// resolution is what one round of queries found: the endpoints, the addresses left out, and the smallest
// TTL of what it used.
type resolution struct {
	eps     []discovery.Endpoint
	refused []refusal
	dropped int // SRV targets past maxSRVTargets
	ttl     ttl
}

// refusal is one answer address left out of the set, and why.
type refusal struct {
	host string
	addr netip.Addr
	err  error
}

// resolve runs one round: the source's SRV or A/AAAA records, down to endpoints, in at most
// roundTimeouts timeouts.
func (w *Watcher) resolve(ctx context.Context) (*resolution, error) {
	limit := roundTimeouts * w.timeout
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	r := &resolution{}
	var err error
	if w.record == config.RecordSRV {
		err = w.resolveSRV(rctx, r)
	} else {
		err = w.resolveHost(rctx, r, w.host, w.port)
	}
	if err != nil && ctx.Err() == nil && rctx.Err() != nil {
		return nil, fmt.Errorf("cannot finish a round within %s: %w", limit, err)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// resolveSRV adds the endpoints of the source's SRV records: every target's addresses, from the
// additional section when it has them, else asked for, on the record's port. Priority and weight are not
// used: every target the name lists takes traffic, as the route's strategy shares it.
func (w *Watcher) resolveSRV(ctx context.Context, r *resolution) error {
	q, err := newQuestion(w.host, dnsmessage.TypeSRV)
	if err != nil {
		return err
	}
	a, err := w.exchange(ctx, q)
	if err != nil {
		return err
	}
	srvs := a.ofType(dnsmessage.TypeSRV, a.owners(nameKey(q.name), &r.ttl), &r.ttl)
	if len(srvs) == 0 {
		r.ttl.seeAll(a.negTTL)
	}
	targets := groupTargets(srvs, r)
	for _, t := range targets {
		if err := w.resolveTarget(ctx, r, a, t); err != nil {
			return err
		}
	}
	return nil
}

// srvTarget is one SRV target and the ports its records give it.
type srvTarget struct {
	name  dnsmessage.Name
	ports []uint16
}

// groupTargets returns the SRV records' targets, each once with its ports, in the answer's order, at most
// maxSRVTargets; the rest are counted in r.dropped. A target "." (the service is not there, RFC 2782), a
// port 0 and a target that is not printable ASCII are left out.
func groupTargets(srvs []record, r *resolution) []srvTarget {
	var out []srvTarget
	index := map[string]int{}
	for _, s := range srvs {
		key := nameKey(s.name)
		if key == "." || s.port == 0 || !printable(key) {
			continue
		}
		i, ok := index[key]
		if !ok {
			if len(out) == maxSRVTargets {
				r.dropped++
				continue
			}
			i = len(out)
			index[key] = i
			out = append(out, srvTarget{name: s.name})
		}
		out[i].ports = append(out[i].ports, s.port)
	}
	return out
}

// resolveTarget adds the endpoints of one SRV target, on each of its ports.
func (w *Watcher) resolveTarget(ctx context.Context, r *resolution, a *answer, t srvTarget) error {
	host := displayName(t.name)
	addrs := a.extraAddrs(nameKey(t.name), &r.ttl)
	if len(addrs) == 0 {
		var err error
		if addrs, err = w.lookupAddrs(ctx, r, host); err != nil {
			return err
		}
	}
	for _, p := range t.ports {
		w.addEndpoints(r, host, addrs, p)
	}
	return nil
}

// resolveHost adds the endpoints of host's A and AAAA records on port, named host.
func (w *Watcher) resolveHost(ctx context.Context, r *resolution, host string, port uint16) error {
	addrs, err := w.lookupAddrs(ctx, r, host)
	if err != nil {
		return err
	}
	w.addEndpoints(r, host, addrs, port)
	return nil
}

// lookupAddrs asks for host's A and then AAAA records. Either failing fails the round: a set missing a
// family's addresses would drop endpoints that are there.
func (w *Watcher) lookupAddrs(ctx context.Context, r *resolution, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeAAAA} {
		q, err := newQuestion(host, typ)
		if err != nil {
			return nil, err
		}
		a, err := w.exchange(ctx, q)
		if err != nil {
			return nil, err
		}
		recs := a.ofType(typ, a.owners(nameKey(q.name), &r.ttl), &r.ttl)
		if len(recs) == 0 {
			r.ttl.seeAll(a.negTTL)
		}
		for _, rec := range recs {
			out = append(out, rec.addr)
		}
	}
	return out, nil
}

// addEndpoints adds a ready endpoint on port for each of addrs the egress policy allows; the others are
// noted in r.refused.
func (w *Watcher) addEndpoints(r *resolution, name string, addrs []netip.Addr, port uint16) {
	for _, a := range addrs {
		if err := w.usable(name, a); err != nil {
			r.refused = append(r.refused, refusal{host: name, addr: a, err: err})
			continue
		}
		r.eps = append(r.eps, discovery.Endpoint{Addr: netip.AddrPortFrom(a, port), Name: name, Ready: true})
	}
}

// usable reports why a, an address of host, cannot be an engine's: it is not a unicast address, or the
// egress policy refuses it.
func (w *Watcher) usable(host string, a netip.Addr) error {
	if a.IsUnspecified() || a.IsMulticast() {
		return fmt.Errorf("%s is not a unicast address", a)
	}
	return w.check(host, a)
}

// displayName is a name as an operator writes it: without the trailing dot.
func displayName(n dnsmessage.Name) string {
	s := n.String()
	if len(s) > 1 {
		s = strings.TrimSuffix(s, ".")
	}
	return s
}

// printable reports whether s is printable ASCII, as host names are: a target of other bytes is no
// engine's, and would reach logs and the dashboard as it is.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}
