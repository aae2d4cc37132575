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
	id atomic.Uint64 // the adapter (loraRoute.id), 0 for an empty entry
	at atomic.Int64  // unix nanoseconds of its last send
}

// lruEntries bounds the adapters remembered per engine: more than any max_loras the picture is read with.
const lruEntries = 16

// touch records a send of adapter id at now, replacing the least recent entry when id has none.
func (l *slotLRU) touch(id uint64, now int64) {
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

// victimAge returns how long before now the adapter a new one would evict was last sent: the slots-th most
// recent entry's age, or MaxInt64 when fewer than slots adapters are held (a slot is free).
func (l *slotLRU) victimAge(slots int, now int64) int64 {
	if slots <= 0 || slots > lruEntries {
		slots = lruEntries
	}
	var ats [lruEntries]int64
	n := 0
	for i := range l.e {
		if l.e[i].id.Load() != 0 {
			ats[n] = l.e[i].at.Load()
			n++
		}
	}
	if n < slots {
		return math.MaxInt64
	}
	// The slots-th largest of n <= 16 values: a partial selection sort.
	for i := range slots {
		best := i
		for j := i + 1; j < n; j++ {
			if ats[j] > ats[best] {
				best = j
			}
		}
		ats[i], ats[best] = ats[best], ats[i]
	}
	return now - ats[slots-1]
}
