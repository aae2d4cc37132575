package dnssrc

import (
	"context"
	"net/netip"
	"time"

	"github.com/rolter-ai/rolter/discovery"
)

// watch is the state of one Watch call: what the sink was last told, the backoff of a failing server,
// and the addresses refused last round (logged once, not every round).
type watch struct {
	*Watcher
	sink    discovery.Sink
	last    endpointSet
	told    bool // a Set since the start or the last Fail
	backoff backoff
	refused map[refusalKey]bool
	dropped int // SRV targets left out last round
}

// refusalKey is one refused address of one host.
type refusalKey struct {
	host string
	addr netip.Addr
}

// Watch resolves the source's name, reports the set to sink and asks again when the answer's smallest
// TTL runs out (within [min_ttl_secs, max_ttl_secs]), until ctx is done. Set comes after the first
// resolution, whenever the set changes, and after each recovery from a failure, even to the same set; a
// failed resolution is reported with Fail, the last set standing, and retried with backoff from
// min_ttl_secs to max_ttl_secs. It returns when ctx is done, with nothing of its own left running.
func (w *Watcher) Watch(ctx context.Context, sink discovery.Sink) {
	s := &watch{Watcher: w, sink: sink, backoff: backoff{min: w.minTTL, max: w.maxTTL}}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d, ok := s.round(ctx)
		if !ok {
			return
		}
		t.Reset(d)
	}
}

// round resolves once and reports to the sink. It returns how long until the next round, and false when
// ctx ended the round.
func (s *watch) round(ctx context.Context) (time.Duration, bool) {
	r, err := s.resolve(ctx)
	if ctx.Err() != nil {
		return 0, false
	}
	if err != nil {
		s.fail(err)
		return s.backoff.wait(), true
	}
	s.backoff.reset()
	s.logRefused(r)
	set := newEndpointSet(r.eps)
	if !s.told || !set.equal(s.last) {
		s.sink.Set(set.forSink())
		s.last, s.told = set, true
	}
	return r.ttl.clamp(s.minTTL, s.maxTTL), true
}

// fail reports err; the next successful round tells the set again.
func (s *watch) fail(err error) {
	s.log.Warn("cannot resolve the source's endpoints", "name", s.host, "err", err)
	s.sink.Fail(err)
	s.told = false
}

// logRefused logs the addresses r left out that the round before did not, and SRV targets dropped when
// their count changes.
func (s *watch) logRefused(r *resolution) {
	now := make(map[refusalKey]bool, len(r.refused))
	for _, f := range r.refused {
		k := refusalKey{f.host, f.addr}
		if !s.refused[k] && !now[k] {
			s.log.Warn("an address of the source is left out", "host", f.host, "addr", f.addr, "err", f.err)
		}
		now[k] = true
	}
	s.refused = now
	if r.dropped > 0 && r.dropped != s.dropped {
		s.log.Warn("the source lists more SRV targets than are followed", "name", s.host, "max", maxSRVTargets, "dropped", r.dropped)
	}
	s.dropped = r.dropped
}
