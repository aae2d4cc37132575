package clientconn

import "sync/atomic"

// Budget counts the sockets the gateway holds - client connections and upstream connections together -
// against one limit derived from the process's open-file limit, so that neither side can starve the other
// into accept4 or connect failing with EMFILE.
//
// Budget is safe for concurrent use.
type Budget struct {
	limit int64 // <= 0: unlimited

	_    [64]byte
	open atomic.Int64
	_    [56]byte
}

// Take reserves one socket. It reports false, reserving nothing, when the budget is spent.
func (b *Budget) Take() bool {
	if b == nil {
		return true
	}
	if n := b.open.Add(1); b.limit > 0 && n > b.limit {
		b.open.Add(-1)
		return false
	}
	return true
}

// Put returns a socket reserved by Take.
func (b *Budget) Put() {
	if b != nil {
		b.open.Add(-1)
	}
}

// InUse returns the sockets reserved now.
func (b *Budget) InUse() int64 {
	if b == nil {
		return 0
	}
	return b.open.Load()
}
