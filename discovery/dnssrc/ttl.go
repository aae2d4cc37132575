package dnssrc

import "time"

// ttl is the smallest TTL a resolution saw, in seconds: the set it found is good until then. The zero
// value has seen none.
type ttl struct {
	secs uint32
	seen bool
}

// see takes one record's TTL.
func (t *ttl) see(secs uint32) {
	if !t.seen || secs < t.secs {
		t.secs, t.seen = secs, true
	}
}

// clamp returns when to ask again: the TTL within [lo, hi], and lo when no record said (an empty answer
// without an SOA), so that a name that comes to exist is seen soon.
func (t ttl) clamp(lo, hi time.Duration) time.Duration {
	if !t.seen {
		return lo
	}
	d := time.Duration(t.secs) * time.Second
	return min(max(d, lo), hi)
}

// seeAll takes what u saw, if anything.
func (t *ttl) seeAll(u ttl) {
	if u.seen {
		t.see(u.secs)
	}
}
