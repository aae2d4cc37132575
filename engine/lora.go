package engine

import (
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/mix"
)

// An adapter route is the route config.ServedRoutes makes for one LoRA adapter of a [routes.lora] route: its
// targets are the base route's engines under the adapter's name, and its strategy ranks only the adapter's
// home set (docs/routing/lora.md):
//
//  1. the replicas that hold the adapter - it runs there (the engine's vllm:lora_requests_info), this
//     gateway has requests of it in flight there, or it is among the max_loras adapters this gateway sent
//     there last, which vLLM keeps loaded - in the adapter's rendezvous order;
//  2. then, while the set is short, one of the first max_home_replicas replicas of that order: the one
//     where the adapter would displace the least: a free slot, else the idle adapter the engine would
//     evict (its least recently used) with the lowest request rate here. The rendezvous order is a
//     weighted hash of (adapter, provider name), the same on every gateway, so each adapter lands on few
//     replicas and each replica serves few adapters, and a rarely used adapter takes the slot of another
//     rarely used one rather than of a busy one.
//
// k of them, k growing with the adapter's requests in flight (one replica per replica_requests) between
// home_replicas and max_home_replicas, and shrinking by one per cool_secs once the load is lower. A replica
// whose /v1/models is known and does not list the adapter cannot serve it unless the gateway loads it
// (dynamic_lora, lora_load.go). When none of the set can take a request, the other eligible replicas can.

// loraRoute is the adapter side of an adapter route.
type loraRoute struct {
	adapter string
	id      uint64 // the adapter in the engines' slot pictures (slotLRU)
	base    string // the model of the route that names the adapter
	// order lists the target indexes by rendezvous score, best first; rank[i] is target i's place in it.
	order      []int
	kMin, kMax int
	per        int64 // replica_requests
	slots      int   // max_loras: the engines' adapter slots when their /metrics does not say
	cool       int64 // nanoseconds
	dynamic    bool
	path       string // lora_path of dynamic loads
	timeout    time.Duration
	// targets are the per-target states, by target index.
	targets []*loraTarget
	// live is the adapter's load and home set width, shared with the adapter route of the snapshot this one
	// replaced so a reload does not reset them.
	live *loraLive
}

// loraLive is what an adapter's requests write.
type loraLive struct {
	_        [64]byte
	inflight atomic.Int64 // this gateway's requests of the adapter in flight
	k        atomic.Int64 // the home set's width
	needAt   atomic.Int64 // unix nanoseconds when the load last needed k replicas
	rate     rateCount    // the adapter's requests here, decayed over cool_secs
}

// loraTarget is one replica's state for one adapter.
type loraTarget struct {
	_        [64]byte
	inflight atomic.Int64 // this gateway's requests of the adapter in flight on the replica
	_        [56]byte
	live     *loraLive // the adapter's, read by the placement of other adapters (slotLRU.victim)
	load     loader    // dynamic loads (lora_load.go)
}

// newLoRARoute builds the adapter side of route r from its config; prev is the adapter route of the same
// name in the snapshot being replaced, or nil: its live counters and, per provider, its target states are
// kept.
func newLoRARoute(r *Route, rc *config.RouteConfig, prev *Route) *loraRoute {
	l := rc.LoRA
	n := len(r.Targets)
	lr := &loraRoute{
		adapter: rc.Model, base: rc.LoRABase, id: xxhash.Sum64String(rc.Model) | 1, slots: *l.MaxLoRAs,
		kMin: min(*l.HomeReplicas, n), kMax: min(*l.MaxHomeReplicas, n),
		per: int64(*l.ReplicaRequests), cool: int64(*l.CoolSecs * float64(time.Second)),
		dynamic: l.DynamicLoRA, path: l.PathOf(rc.Model),
		timeout: time.Duration(*l.LoadTimeoutSecs * float64(time.Second)),
		targets: make([]*loraTarget, n),
	}
	var old *loraRoute
	if prev != nil {
		old = prev.lora
	}
	if old != nil {
		lr.live = old.live
	} else {
		lr.live = &loraLive{}
		lr.live.k.Store(int64(lr.kMin))
	}
	for i, t := range r.Targets {
		if old != nil {
			if j := prev.target(t.Provider.Name, t.Model); j >= 0 {
				lr.targets[i] = old.targets[j]
				continue
			}
		}
		lr.targets[i] = &loraTarget{live: lr.live}
	}
	lr.order = rendezvousOrder(rc.Model, r.Targets)
	return lr
}

// rendezvousOrder ranks targets for adapter by weighted rendezvous hashing: target i scores
// w_i / -ln(u_i), u_i uniform in (0,1) from a hash of (adapter, provider name), so a replica of twice the
// weight is first for twice the adapters and the order is independent of how the targets are listed.
func rendezvousOrder(adapter string, targets []*Target) []int {
	h := xxhash.Sum64String(adapter)
	score := make([]float64, len(targets))
	order := make([]int, len(targets))
	for i, t := range targets {
		u := (float64(mix.Mix64(h^PeerID(t.Provider.Name, ""))>>11) + 0.5) / (1 << 53)
		score[i] = t.Weight / -math.Log(u)
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool {
		sa, sb := score[order[a]], score[order[b]]
		if sa != sb {
			return sa > sb
		}
		return targets[order[a]].Provider.Name < targets[order[b]].Provider.Name
	})
	return order
}

// width returns the home set's width for a request arriving at now, growing it at once when the adapter's
// load needs more replicas and shrinking it by one per cool nanoseconds the load has needed fewer.
func (lr *loraRoute) width(now int64) int {
	live := lr.live
	want := lr.want(0)
	k := live.k.Load()
	if want >= k {
		if want > k && live.k.CompareAndSwap(k, want) {
			k = want
		}
		// The timestamp is written at most every millisecond: every core's requests of a hot adapter
		// would otherwise write its cache line on each one.
		if now-live.needAt.Load() > int64(time.Millisecond) {
			live.needAt.Store(now)
		}
		return lr.bound(max(k, want))
	}
	if c := lr.cooled(k, want, now); c < k && live.k.CompareAndSwap(k, c) {
		live.needAt.Store(now)
		k = c
	}
	return lr.bound(max(k, want))
}

// bound caps a width at max_home_replicas (a reload may have lowered it under a wider set).
func (lr *loraRoute) bound(k int64) int { return int(min(k, int64(lr.kMax))) }

// want is the width the adapter's load needs with extra more requests: one replica per replica_requests of
// them in flight, within the bounds.
func (lr *loraRoute) want(extra int64) int64 {
	w := (lr.live.inflight.Load() + extra + lr.per) / lr.per // this request included: ceil((inflight+1)/per)
	return min(max(w, int64(lr.kMin)), int64(lr.kMax))
}

// cooled is width k shrunk by one per cool nanoseconds since the load last needed it, down to want.
func (lr *loraRoute) cooled(k, want, now int64) int64 {
	steps := (now - lr.live.needAt.Load()) / lr.cool
	return max(want, k-steps)
}

// current is the width the next request would see at now, without changing it (the state view).
func (lr *loraRoute) current(now int64) int {
	k, want := lr.live.k.Load(), lr.want(0)
	if want >= k {
		return lr.bound(want)
	}
	return lr.bound(lr.cooled(k, want, now))
}

// holds reports whether target i holds the adapter: the engine reports it running, this gateway has
// requests of it in flight there, or it is among the engine's max_loras adapters this gateway sent most
// recently (vLLM keeps those loaded). Requests of it waiting there are no reason to move it: vLLM's
// waiting_lora_adapters counts requests queued for any cause, and the home set widens with the load.
func (lr *loraRoute) holds(t *Target, i int, now int64) bool {
	if lr.targets[i].inflight.Load() > 0 || t.Provider.loraSlots.holds(lr.id, lr.slotsOf(t, now)) {
		return true
	}
	a := t.Provider.adapters
	return a != nil && a.running(lr.adapter, now)
}

// slotsOf is target t's adapter slots: what its engine reports (max_lora), else the configured max_loras.
func (lr *loraRoute) slotsOf(t *Target, now int64) int {
	if a := t.Provider.adapters; a != nil {
		if n, ok := a.slots(now); ok {
			return min(n, lruEntries)
		}
	}
	return lr.slots
}

// serves reports whether target t can serve the adapter: it lists it in /v1/models, the gateway can load it
// there, or its list is not known.
func (lr *loraRoute) serves(t *Target, i int, now int64) bool {
	if lr.dynamic || lr.targets[i].load.done.Load() {
		return true
	}
	a := t.Provider.adapters
	return a == nil || a.serves(lr.adapter, now)
}

// restrict narrows p's eligible targets to the adapter's home set and returns the eligible targets left out,
// which take the request only when none of the set can.
func (lr *loraRoute) restrict(p *Pick) (spill uint64) {
	all := p.EligibleMask
	set := lr.choose(p.Route.Targets, all, lr.width(p.Now), p.Now)
	p.Eligible = p.Eligible[:0]
	for i := range p.Route.Targets {
		if set&(1<<i) != 0 {
			p.Eligible = append(p.Eligible, i)
		}
	}
	p.EligibleMask = set
	return all &^ set
}

// preview returns the home set a request of the adapter would get at now, without counting it (the state
// view).
func (lr *loraRoute) preview(r *Route, now int64) []int {
	var eligible uint64
	for i, t := range r.Targets {
		if t.Provider.health.eligible(now) {
			eligible |= 1 << i
		}
	}
	if eligible == 0 {
		return nil
	}
	set := lr.choose(r.Targets, eligible, lr.current(now), now)
	var out []int
	for _, i := range lr.order {
		if set&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// choose returns the home set of width k among the eligible targets that can serve the adapter (all of them
// when none can: their lists may be stale): the holders first, in rendezvous order; then, while the set is
// short, of the first max_home_replicas others in rendezvous order, the one where the adapter would
// displace the least (slotLRU.victim): a free slot first, else the idle adapter with the lowest rate, the
// longest idle of equals - so a new adapter takes the place of the fleet's coldest, within a bounded set of
// replicas.
func (lr *loraRoute) choose(targets []*Target, eligible uint64, k int, now int64) uint64 {
	var able uint64
	for i, t := range targets {
		if eligible&(1<<i) != 0 && lr.serves(t, i, now) {
			able |= 1 << i
		}
	}
	if able == 0 {
		able = eligible
	}
	var set uint64
	n := 0
	for _, i := range lr.order {
		if n == k {
			break
		}
		if able&(1<<i) != 0 && lr.holds(targets[i], i, now) {
			set |= 1 << i
			n++
		}
	}
	for n < k {
		best, seen := -1, 0
		var bestV victim
		for _, i := range lr.order {
			if able&(1<<i) == 0 {
				continue
			}
			if seen++; seen > lr.kMax {
				break
			}
			if set&(1<<i) != 0 {
				continue
			}
			t := targets[i]
			if v := t.Provider.loraSlots.victim(lr.slotsOf(t, now), now, lr.cool); best < 0 || v.less(bestV) {
				best, bestV = i, v
			}
		}
		if best < 0 {
			break
		}
		set |= 1 << best
		n++
	}
	return set
}

// sent counts a request of the adapter going to target i; done, its end.
func (lr *loraRoute) sent(t *Target, now int64) {
	i := t.Index
	st := lr.targets[i]
	st.inflight.Add(1)
	lr.live.inflight.Add(1)
	lr.live.rate.add(now, lr.cool)
	t.Provider.loraSlots.touch(lr.id, st, now)
}

func (lr *loraRoute) done(i int) {
	lr.targets[i].inflight.Add(-1)
	lr.live.inflight.Add(-1)
}
