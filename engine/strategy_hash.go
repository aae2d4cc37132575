package engine

import (
	"encoding/binary"
	"sort"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/mix"
)

const (
	defaultVirtualNodes = config.DefaultVirtualNodes
	defaultEpsilon      = config.DefaultEpsilon
	// defaultKeyBytes caps the opening hashed. It only bounds the hashing cost - xxhash runs at ~15 GB/s,
	// ~4 us for 64 KiB, where the scan of the body that held it runs at ~2.5 GB/s (BenchmarkScanRequest) - a
	// cap shorter than a shared system prompt would send every conversation that opens with it to one
	// target again.
	defaultKeyBytes = config.DefaultKeyBytes
)

// consistentHash maps a key to a ring of virtual nodes: the request's session key (sessionID) when it has
// one, else the conversation's opening - the prompt key up to the end of its first user message, at most
// key_bytes of it - so every turn of a conversation lands on one target while conversations that share a
// system prompt but not their first question spread (hashing the first 256 bytes sent every conversation
// under one long system prompt to one target). A request without either (an empty prompt key: other
// endpoints) has nothing to hash and goes to the least-loaded target.
//
// Adding or removing a target moves about 1/N of the keys. Ineligible targets are skipped. Rank writes the
// eligible targets in ring order; the route's load bound, whose epsilon is this strategy's "epsilon", then
// puts the first of them with room first (bound.go): "consistent hashing with bounded loads" (Mirrokni,
// Thorup, Zadimoghaddam 2018), per unit of weight, so one hot key cannot melt a replica - it spills to the
// next targets on the ring.
type consistentHash struct {
	ring     []uint64 // sorted virtual node hashes
	owner    []uint8  // owner[i] = target of ring[i]
	keyBytes int
}

func newConsistentHash(r *Route, p config.RouteParams) *consistentHash {
	s := &consistentHash{keyBytes: defaultKeyBytes}
	vnodes := defaultVirtualNodes
	if p.VirtualNodes != nil {
		vnodes = *p.VirtualNodes
	}
	if p.KeyBytes != nil {
		s.keyBytes = *p.KeyBytes
	}
	type vnode struct {
		h     uint64
		owner uint8
	}
	var nodes []vnode
	var buf [8]byte
	for i, t := range r.Targets {
		// Virtual nodes are named by provider and model, not by position, so reordering or adding targets
		// keeps every other target's points where they were.
		name := t.Provider.Name + "\x00" + t.Model
		for v := 0; v < vnodes; v++ {
			binary.LittleEndian.PutUint64(buf[:], uint64(v))
			d := xxhash.New()
			d.WriteString(name)
			d.Write(buf[:])
			nodes = append(nodes, vnode{d.Sum64(), uint8(i)})
		}
	}
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].h < nodes[b].h })
	for _, n := range nodes {
		s.ring = append(s.ring, n.h)
		s.owner = append(s.owner, n.owner)
	}
	return s
}

// key returns the ring key of the request, false when it has nothing to hash.
func (s *consistentHash) key(p *Pick) (uint64, bool) { return conversationKey(p, s.keyBytes) }

// conversationKey hashes what names the request's conversation: its session key when it has one, else its
// opening (the prompt key up to the end of its first user message), at most keyBytes of it; false when the
// request has neither.
func conversationKey(p *Pick, keyBytes int) (uint64, bool) {
	if len(p.SessionID) > 0 {
		return xxhash.Sum64(p.SessionID), true
	}
	k := p.Key
	if p.Opening > 0 && p.Opening < len(k) {
		k = k[:p.Opening]
	}
	if len(k) > keyBytes {
		k = k[:keyBytes]
	}
	return xxhash.Sum64(k), len(k) > 0
}

// homeOf returns the position in p.Eligible of the conversation's home: the eligible target with the
// highest rendezvous weight mix(key, peerID) (highest random weight hashing, Thaler and Ravishankar 1998).
// Every replica with the same targets computes the same home, and losing or adding a target moves only the
// conversations whose home it was or becomes. False when the request names no conversation.
func homeOf(p *Pick) (int, bool) {
	h, ok := conversationKey(p, defaultKeyBytes)
	if !ok || len(p.Eligible) == 0 {
		return 0, false
	}
	best, bestW := 0, uint64(0)
	for k, i := range p.Eligible {
		if w := mix.Mix64(h ^ p.Route.Targets[i].peerID); k == 0 || w > bestW {
			best, bestW = k, w
		}
	}
	return best, true
}

func (s *consistentHash) Rank(p *Pick, out []int) (int, Decision) {
	h, ok := s.key(p)
	if !ok {
		out[0], _ = leastLoaded(p)
		return 1, decide(ReasonLeastLoad)
	}
	start := s.search(h)
	var seen uint64
	n := 0
	for k := 0; k < len(s.ring) && n < len(p.Eligible); k++ {
		t := int(s.owner[(start+k)%len(s.ring)])
		if seen&(1<<t) != 0 {
			continue
		}
		seen |= 1 << t
		if p.EligibleMask&(1<<t) == 0 {
			continue
		}
		out[n] = t
		n++
	}
	return n, decide(ReasonHash)
}

// search returns the index of the first ring point >= h (len(ring) wraps to 0 via the caller's modulo).
func (s *consistentHash) search(h uint64) int {
	lo, hi := 0, len(s.ring)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.ring[m] < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

var _ Strategy = (*consistentHash)(nil)
