package cluster

import (
	"sync"
	"sync/atomic"
	"time"
)

// peerLoads is the peers' in-flight requests: the latest load message of each peer replica, and their sum
// per provider name, which it hands to the gateway (Gateway.SetPeerLoads) after every change.
//
// Only the names of this gateway's own providers are kept (known, refreshed from Gateway.Inflight every
// interval), so its memory is bounded by maxPeers x that many names whatever the peers send, and a peer's
// claim on a provider is cut to that provider's cap. A peer not heard from for maxAge is forgotten, and
// its requests with it. Safe for concurrent use.
type peerLoads struct {
	set      func(map[string]int64) // Gateway.SetPeerLoads; called with mu held, so in order
	maxAge   time.Duration
	maxPeers int

	mu     sync.Mutex
	closed bool
	known  map[string]int64 // this gateway's own providers, each with the most in-flight a peer may claim
	peers  map[string]*peerLoad
	sum    map[string]int64
	live   atomic.Int64 // len(peers), for the gauge
	full   bool         // an unknown peer was ignored since the table last had room (logged once)
}

type peerLoad struct {
	at       time.Time
	lastTS   int64 // the envelope's timestamp of its last message; 0 without a key
	inflight map[string]int64
}

func newPeerLoads(set func(map[string]int64), maxAge time.Duration, maxPeers int) *peerLoads {
	return &peerLoads{set: set, maxAge: maxAge, maxPeers: maxPeers, peers: map[string]*peerLoad{},
		sum: map[string]int64{}}
}

// setKnown replaces the names kept: caps is the gateway's own provider names, each with the most in-flight
// one peer may claim on it; the caller gives it up.
func (l *peerLoads) setKnown(caps map[string]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.known = caps
}

// updateResult says what update refused of a load message.
type updateResult struct {
	tooMany      bool // ignored: from a peer beyond maxPeers
	firstTooMany bool // and the first such since there was room (for the caller to log once)
	replayed     bool // ignored: its timestamp is not after the peer's last
	capped       int  // claims cut to their provider's cap
}

// update records m, received at now with the envelope's timestamp ts (0 without a key).
func (l *peerLoads) update(m loadMessage, ts int64, now time.Time) (r updateResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return r
	}
	p := l.peers[m.ID]
	if p == nil {
		if len(l.peers) >= l.maxPeers {
			l.expireLocked(now)
		}
		if len(l.peers) >= l.maxPeers {
			r.tooMany, r.firstTooMany = true, !l.full
			l.full = true
			return r
		}
		p = &peerLoad{inflight: map[string]int64{}}
		l.peers[m.ID] = p
		l.live.Store(int64(len(l.peers)))
	}
	if ts != 0 {
		if ts <= p.lastTS {
			r.replayed = true
			return r
		}
		p.lastTS = ts
	}
	p.at = now
	changed := false
	for name, n := range p.inflight {
		if l.claim(name, m.Inflight[name]) != n || !l.isKnown(name) {
			l.add(name, -n)
			delete(p.inflight, name)
			changed = true
		}
	}
	for name, n := range m.Inflight {
		if !l.isKnown(name) {
			continue
		}
		if c := l.claim(name, n); c != n {
			n = c
			r.capped++
		}
		if _, ok := p.inflight[name]; ok || n == 0 {
			continue
		}
		p.inflight[name] = n
		l.add(name, n)
		changed = true
	}
	if changed {
		l.set(l.sum)
	}
	return r
}

// claim is n cut to name's cap.
func (l *peerLoads) claim(name string, n int64) int64 {
	if c, ok := l.known[name]; ok && n > c {
		return c
	}
	return n
}

func (l *peerLoads) isKnown(name string) bool {
	_, ok := l.known[name]
	return ok
}

// add adds n to the sum of name, deleting it at 0.
func (l *peerLoads) add(name string, n int64) {
	if v := l.sum[name] + n; v != 0 {
		l.sum[name] = v
	} else {
		delete(l.sum, name)
	}
}

// expire forgets the peers not heard from for maxAge at now.
func (l *peerLoads) expire(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if l.expireLocked(now) {
		l.set(l.sum)
	}
}

// expireLocked forgets quiet peers and reports whether the sum changed.
func (l *peerLoads) expireLocked(now time.Time) bool {
	changed := false
	for id, p := range l.peers {
		if now.Sub(p.at) <= l.maxAge {
			continue
		}
		for name, n := range p.inflight {
			l.add(name, -n)
			changed = true
		}
		delete(l.peers, id)
	}
	l.live.Store(int64(len(l.peers)))
	if len(l.peers) < l.maxPeers {
		l.full = false
	}
	return changed
}

// close stops every later update and removes the peers' loads from the gateway.
func (l *peerLoads) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.peers, l.sum = nil, nil
	l.live.Store(0)
	l.set(nil)
}
