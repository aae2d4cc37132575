package engine

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/trie"
)

// Peers is the routing evidence other gateway replicas share with this one (the cluster package carries it
// over NATS, docs/architecture.md "Many gateways"). The engine never imports its implementation: cmd wires
// one in with SetPeers, and nil means routing on local evidence only.
//
// Evidence is named by checkpoints: chained hashes of a prompt key's leading bytes up to fixed offsets
// (peerCheckpointEnds), identical on every replica, and by the engine they were sent to (Target.peerID, a
// hash of the provider's name and upstream model).
type Peers interface {
	// Held returns how many leading checkpoints of cps the peers reported sending to engine: k means
	// cps[:k] were seen for it (an approximation: a peer's evidence may have been evicted or lost).
	// It runs on the request path: lock-free and allocation-free.
	Held(engine uint64, cps []uint64) int
	// Routed tells the peers that this gateway sent a request whose key has checkpoints cps to engine. It
	// must not block and must not keep cps after it returns.
	Routed(engine uint64, cps []uint64)
}

// peersBox holds the gateway's Peers behind one atomic pointer.
type peersBox struct{ p Peers }

// SetPeers installs the evidence shared with other replicas (nil: none). Safe while serving.
func (g *Gateway) SetPeers(p Peers) {
	if p == nil {
		g.peers.Store(nil)
		return
	}
	g.peers.Store(&peersBox{p})
}

// SetPeerLoads sets the in-flight requests other replicas have on each provider of the live snapshot, by
// provider name; providers not in loads get 0. A provider's load is its own in-flight plus the larger of
// this and the load other clients put on its engine as [metrics_scrape] reads it (which counts the peers'
// requests too, only later).
func (g *Gateway) SetPeerLoads(loads map[string]int64) {
	for _, p := range g.snap.Load().Providers {
		p.peerLoad.Store(max(loads[p.Name], 0))
	}
}

// Inflight calls fn with this gateway's own in-flight count on each provider of the live snapshot.
func (g *Gateway) Inflight(fn func(provider string, n int64)) {
	for _, p := range g.snap.Load().Providers {
		fn(p.Name, p.inflight.Load())
	}
}

// PeerID is the name of an engine in the shared evidence: every replica derives the same from the
// provider's name and the upstream model.
func PeerID(provider, model string) uint64 {
	d := xxhash.New()
	_, _ = d.WriteString(provider)
	_, _ = d.Write([]byte{0})
	_, _ = d.WriteString(model)
	return d.Sum64()
}

// maxPeerCheckpoints bounds the checkpoints of one key, and so the evidence one request publishes.
const maxPeerCheckpoints = 96

// peerCheckpointEnds are the offsets in the prompt key where checkpoints end: every 256 bytes up to 8 KiB,
// every KiB up to 64 KiB, every 8 KiB up to 128 KiB. Fine where prompts are short and a few hundred bytes
// of a turn decide the score, coarse where they are long; a key longer than 128 KiB is named by its first
// 128 KiB. The offsets are a contract between replicas: every gateway of a fleet must use the same.
var peerCheckpointEnds = func() (e [maxPeerCheckpoints]int32) {
	n := 0
	for off := 256; off <= 8<<10; off += 256 {
		e[n] = int32(off)
		n++
	}
	for off := 9 << 10; off <= 64<<10; off += 1 << 10 {
		e[n] = int32(off)
		n++
	}
	for off := 72 << 10; off <= 128<<10; off += 8 << 10 {
		e[n] = int32(off)
		n++
	}
	if n != maxPeerCheckpoints {
		panic("engine: peer checkpoint table")
	}
	return e
}()

// peerSeed starts every checkpoint hash; changing it makes replicas of different versions disagree.
const peerSeed = 0x726f6c7465722d31 // "rolter-1"

// peerCheckpoints appends to cps the hashes of key's first end bytes for each checkpoint end it reaches
// (one running xxhash, summed at each end), so equal cps[k] means equal first end(k) bytes. A key shorter
// than the first checkpoint has none. Allocation-free for cps with capacity maxPeerCheckpoints.
func peerCheckpoints(cps []uint64, key []byte) []uint64 {
	var d xxhash.Digest
	startCheckpoints(&d)
	start := 0
	for _, end := range peerCheckpointEnds {
		if int(end) > len(key) {
			break
		}
		_, _ = d.Write(key[start:end])
		cps = append(cps, d.Sum64())
		start = int(end)
	}
	return cps
}

// startCheckpoints resets d to where every checkpoint hash starts: the seed.
func startCheckpoints(d *xxhash.Digest) {
	d.Reset()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], peerSeed)
	_, _ = d.Write(seed[:])
}

// peerFloor rounds a match in key bytes down to the checkpoint end at or below it, the resolution of the
// peers' evidence (a match shorter than the first checkpoint is kept as it is).
func peerFloor(m int) int {
	switch {
	case m < 256:
		return m
	case m <= 8<<10:
		return m &^ 255
	case m <= 64<<10:
		return m &^ (1<<10 - 1)
	case m < 72<<10:
		return 64 << 10
	case m <= 128<<10:
		return m &^ (8<<10 - 1)
	}
	return 128 << 10
}

// peerRound maps a match in key bytes to the middle of its checkpoint segment (between the checkpoint end at
// or below it and the next one), at most n, the key's length: a match the peers' evidence can show and a
// local match in the same segment compare equal, and neither is biased against the threshold by more than
// half a segment. A match shorter than the first checkpoint is kept as it is.
func peerRound(m, n int) int {
	e := peerFloor(m)
	if e < 256 {
		return m
	}
	seg := 256
	switch {
	case e >= 64<<10:
		seg = 8 << 10
	case e >= 8<<10:
		seg = 1 << 10
	}
	return min(e+seg/2, n)
}

// prefixName names p's first m key bytes: the hash of its checkpoint there when m is a checkpoint end, taken
// from p's checkpoints when the peers' evidence already computed them, so the key is not hashed twice;
// else an xxhash of those bytes.
func (p *Pick) prefixName(m int) uint64 {
	if k, ok := slices.BinarySearch(peerCheckpointEnds[:], int32(m)); ok {
		if p.cpsDone && k < len(p.cps) {
			return p.cps[k]
		}
		var d xxhash.Digest
		startCheckpoints(&d)
		_, _ = d.Write(p.Key[:m])
		return d.Sum64()
	}
	return xxhash.Sum64(p.Key[:m])
}

// matchEligible sets ms[k] to the k-th eligible target's match of p's key in key bytes, as the cache
// strategies score it: its trie's (tries[p.Eligible[k]]; 0 when the trie holds an older cache epoch), and
// with peers the larger of that and the peers' evidence. When the peers reported any eligible target, both
// are compared in checkpoint resolution (peerRound): a replica's own trie must not outbid another
// replica's copy by the bytes a checkpoint cannot see, or each replica keeps the copy it made itself. With
// no peer evidence for the request the trie's match is exact, as without peers.
//
// The tries are walked side by side (trie.MatchEach): on tries larger than the processor's caches, their
// cache misses overlap instead of adding up.
func (p *Pick) matchEligible(tries []*trie.Trie, ms []int) {
	targets := p.Route.Targets
	var tbuf [maxTargets]*trie.Trie
	ts := tbuf[:len(p.Eligible)]
	for k, i := range p.Eligible {
		if tr := tries[i]; tr.Owner() == targets[i].Provider.cache.current() {
			ts[k] = tr
		}
	}
	ms = ms[:len(ts)]
	trie.MatchEach(ts, p.Key, ms)
	if p.peers == nil || len(p.Key) < int(peerCheckpointEnds[0]) {
		return
	}
	if !p.cpsDone {
		p.peerEvidence()
	}
	if !p.peerAny {
		return
	}
	for k, i := range p.Eligible {
		ms[k] = peerRound(max(ms[k], int(p.peerM[targets[i].Index])), len(p.Key))
	}
}

// peerEvidence computes p's checkpoints and, for every eligible target, how many leading key bytes the
// peers' evidence covers (p.peerM), and whether any does.
func (p *Pick) peerEvidence() {
	p.cps = peerCheckpoints(p.cps[:0], p.Key)
	p.cpsDone, p.peerAny = true, false
	for _, i := range p.Eligible {
		m := 0
		if k := p.peers.Held(p.Route.Targets[i].peerID, p.cps); k > 0 {
			m = int(peerCheckpointEnds[min(k, len(p.cps))-1])
		}
		p.peerM[i] = int32(m)
		p.peerAny = p.peerAny || m > 0
	}
}

// MaxConns calls fn with the max_conns of each provider of the live snapshot: the most requests a replica
// of the same config can have in flight to it, which bounds what a peer replica may claim.
func (g *Gateway) MaxConns(fn func(provider string, n int64)) {
	for _, p := range g.snap.Load().Providers {
		fn(p.Name, int64(p.cfg.MaxConns))
	}
}
