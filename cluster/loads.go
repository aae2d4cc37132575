package cluster

import (
	"sync"
	"sync/atomic"
	"time"
)

// maxPeers bounds the peer replicas remembered; a load message from one more is ignored until one goes
// quiet.
const maxPeers = 1024

// peerLoads is the peers' in-flight requests: the latest load message of each peer replica, and their sum
// per provider name, which it hands to the gateway (Gateway.SetPeerLoads) after every change.
//
// Only the names of this gateway's own providers are kept (known, refreshed from Gateway.Inflight every
// interval), so its memory is bounded by maxPeers x that many names whatever the peers send. A peer not
// heard from for maxAge is forgotten, and its requests with it. Safe for concurrent use.
type peerLoads struct {
	set    func(map[string]int64) // Gateway.SetPeerLoads; called with mu held, so in order
	maxAge time.Duration

	mu     sync.Mutex
	closed bool
	known  map[string]int64 // this gateway's own in-flight; only the keys are used
	peers  map[string]*peerLoad
	sum    map[string]int64
	live   atomic.Int64 // len(peers), for the gauge
	full   bool         // an unknown peer was ignored since the table last had room (logged once)
}

type peerLoad struct {
	at       time.Time
	inflight map[string]int64
}

func newPeerLoads(set func(map[string]int64), maxAge time.Duration) *peerLoads {
	return &peerLoads{set: set, maxAge: maxAge, peers: map[string]*peerLoad{}, sum: map[string]int64{}}
}

// setKnown replaces the names kept; own is the gateway's own in-flight by provider name, which the caller
// gives up.
func (l *peerLoads) setKnown(own map[string]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.known = own
}

// update records m, received at now. It returns true when m is ignored as coming from a peer too many
// and it is the first such since there was room (for the caller to log once).
func (l *peerLoads) update(m loadMessage, now time.Time) (tooMany bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	p := l.peers[m.ID]
	if p == nil {
		if len(l.peers) >= maxPeers {
			l.expireLocked(now)
		}
		if len(l.peers) >= maxPeers {
			first := !l.full
			l.full = true
			return first
		}
		p = &peerLoad{inflight: map[string]int64{}}
		l.peers[m.ID] = p
		l.live.Store(int64(len(l.peers)))
	}
	p.at = now
	changed := false
	for name, n := range p.inflight {
		if m.Inflight[name] != n || !l.isKnown(name) {
			l.add(name, -n)
			delete(p.inflight, name)
			changed = true
		}
	}
	for name, n := range m.Inflight {
		if _, ok := p.inflight[name]; ok || n == 0 || !l.isKnown(name) {
			continue
		}
		p.inflight[name] = n
		l.add(name, n)
		changed = true
	}
	if changed {
		l.set(l.sum)
	}
	return false
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
	if len(l.peers) < maxPeers {
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
