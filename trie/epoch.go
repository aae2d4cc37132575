package trie

import (
	"math/rand/v2"
	"sync/atomic"
)

// readerStripes spreads the reader counters over several cache lines so that
// concurrent Match calls on different cores do not all bounce one line.
const readerStripes = 16

type readerCounter struct {
	n atomic.Int64
	_ [56]byte // one counter per 64-byte cache line
}

// epochs tells the writer when no reader can still be looking at memory it
// unlinked earlier (a grace period, as in epoch-based reclamation / RCU).
//
// A reader announces itself in active[epoch&1] for the duration of one Match.
// The writer retires unlinked slots into a batch, flips the epoch and may
// reuse the batch once every counter of the old parity has been observed at
// zero: every reader that could have reached the batch entered before the
// flip and is counted there. Readers never wait; the writer never waits either
// (it retries at its next Insert), see state.reclaim.
type epochs struct {
	epoch atomic.Uint64
	_     [56]byte
	// active[p][s] counts readers of parity p that chose stripe s.
	active [2][readerStripes]readerCounter
}

// enter registers a reader and returns the counter to pass to exit.
func (e *epochs) enter() *atomic.Int64 {
	stripe := rand.Uint32() % readerStripes
	for {
		ep := e.epoch.Load()
		c := &e.active[ep&1][stripe].n
		c.Add(1)
		// If the epoch moved between the load and the increment, the writer
		// may already have checked this parity; back out and use the new one.
		// Otherwise (all sync/atomic operations are sequentially consistent)
		// the increment precedes the writer's next flip and it will see it.
		if e.epoch.Load() == ep {
			return c
		}
		c.Add(-1)
	}
}

// exit ends the read section started by enter.
func (e *epochs) exit(c *atomic.Int64) {
	c.Add(-1)
}

// flip starts a new epoch and returns the parity of the one that ended.
// Only the writer calls it (under Trie.mu).
func (e *epochs) flip() uint64 {
	ep := e.epoch.Load()
	e.epoch.Store(ep + 1)
	return ep & 1
}

// drained reports whether no reader of the given parity is active.
//
// A reader's contribution to its stripe is +1 from enter to exit, so a stripe
// read as zero has no active reader of that parity; readers that enter the old
// parity after the flip back out without touching the trie.
func (e *epochs) drained(parity uint64) bool {
	for i := range e.active[parity] {
		if e.active[parity][i].n.Load() != 0 {
			return false
		}
	}
	return true
}
