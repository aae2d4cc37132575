package engine

import "sync/atomic"

// connBudget counts the sockets the gateway holds - client connections and upstream connections together -
// against one limit derived from the process's open-file limit, so that neither side can starve the other
// into accept4 or connect failing with EMFILE.
//
// connBudget is safe for concurrent use.
type connBudget struct {
	limit int64 // <= 0: unlimited

	_    [64]byte
	open atomic.Int64
	_    [56]byte
}

// take reserves one socket. It reports false, reserving nothing, when the budget is spent.
func (b *connBudget) take() bool {
	if b == nil {
		return true
	}
	if n := b.open.Add(1); b.limit > 0 && n > b.limit {
		b.open.Add(-1)
		return false
	}
	return true
}

// put returns a socket reserved by take.
func (b *connBudget) put() {
	if b != nil {
		b.open.Add(-1)
	}
}

// inUse returns the sockets reserved now.
func (b *connBudget) inUse() int64 {
	if b == nil {
		return 0
	}
	return b.open.Load()
}
