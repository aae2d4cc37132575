package engine

import (
	"math"
	"sync/atomic"
	"time"
)

// slotLRU is this gateway's picture of the adapters an engine holds in its adapter slots: the last
// distinct adapters the gateway sent it, each with when. vLLM keeps the max_loras most recently used
// adapters loaded, so, as far as this gateway's own traffic goes, an adapter among the `slots` most recent
// entries is loaded, and the slots-th most recent is the one a new adapter would evict. The engine's own
// report (vllm:lora_requests_info) covers what other clients run.
//
// Entries are atomics: the routing path reads them without a lock, and concurrent sends may race on an
// entry, which only blurs the picture for a moment (the next send of each adapter writes it again).
type slotLRU struct {
	_ [64]byte
	e [lruEntries]lruEntry
}

type lruEntry struct {
	id  atomic.Uint64              // the adapter (loraRoute.id), 0 for an empty entry
	at  atomic.Int64               // unix nanoseconds of its last send
	tgt atomic.Pointer[loraTarget] // the adapter's state on the engine: its requests in flight, its rate
}

// lruEntries bounds the adapters remembered per engine: more than any max_loras the picture is read with.
const lruEntries = 16

// touch records a send of adapter id (its state tgt) at now, replacing the least recent entry when id has
// none.
func (l *slotLRU) touch(id uint64, tgt *loraTarget, now int64) {
	oldest, oldAt := 0, int64(math.MaxInt64)
	for i := range l.e {
		e := &l.e[i]
		if e.id.Load() == id {
			// At most one write a millisecond: every core's sends of a hot adapter would share the line.
			if now-e.at.Load() > int64(time.Millisecond) {
				e.at.Store(now)
			}
			return
		}
		if a := e.at.Load(); a < oldAt {
			oldest, oldAt = i, a
		}
	}
	e := &l.e[oldest]
	e.tgt.Store(tgt)
	e.id.Store(id)
	e.at.Store(now)
}

// holds reports whether adapter id is among the slots most recent entries.
func (l *slotLRU) holds(id uint64, slots int) bool {
	at := int64(-1)
	for i := range l.e {
		if l.e[i].id.Load() == id {
			at = l.e[i].at.Load()
			break
		}
	}
	if at < 0 {
		return false
	}
	newer := 0
	for i := range l.e {
		if l.e[i].id.Load() != id && l.e[i].at.Load() > at {
			newer++
		}
	}
	return newer < slots
}

// victim is what a new adapter sent to an engine would displace there.
type victim struct {
	free bool    // a slot is free
	busy bool    // every slot's adapter has requests in flight: the request would wait for one
	rate float64 // the displaced adapter's request rate (rateCount)
	age  int64   // nanoseconds since it was last sent
}

// less reports whether v displaces less than w: a free slot, then an idle adapter of lower rate, then of
// equal rate idle for longer; a busy engine last.
func (v victim) less(w victim) bool {
	switch {
	case v.free != w.free:
		return v.free
	case v.busy != w.busy:
		return w.busy
	case v.rate != w.rate:
		return v.rate < w.rate
	}
	return v.age > w.age
}

// victim returns what a new adapter would displace on an engine of slots adapter slots at now, tau being
// the rate's time constant: vLLM evicts the least recently used adapter no running request uses, so, of the
// slots most recent entries, the least recent without requests in flight.
func (l *slotLRU) victim(slots int, now, tau int64) victim {
	if slots <= 0 || slots > lruEntries {
		slots = lruEntries
	}
	type held struct {
		at  int64
		tgt *loraTarget
	}
	var hs [lruEntries]held
	n := 0
	for i := range l.e {
		if l.e[i].id.Load() != 0 {
			hs[n] = held{l.e[i].at.Load(), l.e[i].tgt.Load()}
			n++
		}
	}
	if n < slots {
		return victim{free: true}
	}
	// The slots most recent of n <= 16 entries: a partial selection sort, newest first.
	for i := range slots {
		best := i
		for j := i + 1; j < n; j++ {
			if hs[j].at > hs[best].at {
				best = j
			}
		}
		hs[i], hs[best] = hs[best], hs[i]
	}
	for i := slots - 1; i >= 0; i-- {
		t := hs[i].tgt
		if t == nil || t.inflight.Load() > 0 {
			continue
		}
		return victim{rate: t.live.rate.rate(now, tau), age: now - hs[i].at}
	}
	return victim{busy: true}
}
