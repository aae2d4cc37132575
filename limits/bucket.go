package limits

import (
	"math/bits"
	"sync/atomic"
)

// Window is the period a rate limit counts over: a limit of n is n units a minute.
const Window = int64(60e9)

// Bucket is a rate limit of n units per Window as the generic cell rate algorithm keeps it: one atomic
// timestamp, the theoretical arrival time (TAT) - when the bucket would be full again had nothing more
// been taken. Taking c units moves it c x Window/n later, from now at the earliest; a take that would move
// it more than one Window past now is refused. So at most n units are taken in any Window, bursts
// included, and a refused take leaves nothing behind: there is no count of failures to drain.
//
// Take and Give are lock-free (a compare-and-swap loop on the one word); concurrent takes serialize on it,
// so a burst of them can never take more than the bucket holds.
//
// A bucket may hold a share of its limit (SetShare): of a limit kept by N gateways together, each holds
// ceil(n / N) and takes from that alone.
type Bucket struct {
	tat atomic.Int64 // unix nanoseconds
	n   int64
	eff atomic.Int64 // this bucket's share of n: ceil(n / share)
}

// NewBucket returns a full bucket of n units per Window (n > 0).
func NewBucket(n int64) *Bucket {
	b := &Bucket{n: n}
	b.eff.Store(n)
	return b
}

// Limit is the bucket's n; Share its part of it, what it holds when full.
func (b *Bucket) Limit() int64 { return b.n }
func (b *Bucket) Share() int64 { return b.eff.Load() }

// SetShare makes the bucket hold ceil(n / of) of its limit (of >= 1): one of of gateways keeping it. What
// was taken stays taken, now counted against the new share.
func (b *Bucket) SetShare(of int64) { b.eff.Store((b.n + max(of, 1) - 1) / max(of, 1)) }

// span is how far c units move the TAT: c x Window / the share, without overflow for any c and n up to
// 2^40.
func (b *Bucket) span(c int64) int64 {
	if c <= 0 {
		return 0
	}
	n := uint64(b.eff.Load())
	hi, lo := bits.Mul64(uint64(c), uint64(Window))
	if hi >= n { // more than 2^64 ns: refused by any take
		return 1 << 62
	}
	q, _ := bits.Div64(hi, lo, n)
	return int64(min(q, 1<<62))
}

// Take takes c units at now if the bucket holds them. When it does not, wait is how long until it will
// (with nothing else taken meanwhile); c more than the bucket's n is never held, and wait is then -1. A
// take larger than the bucket's share but within n passes when the bucket is full, and empties it for as
// long as it takes to refill that much: one such take at a time per share.
func (b *Bucket) Take(now, c int64) (ok bool, wait int64) {
	if c > b.n {
		return false, -1
	}
	d := b.span(c)
	for {
		tat := b.tat.Load()
		next := max(tat, now) + d
		if over := next - now - Window; over > 0 && (d <= Window || tat > now) {
			if d > Window {
				over = tat - now
			}
			return false, over
		}
		if b.tat.CompareAndSwap(tat, next) {
			return true, 0
		}
	}
}

// Force takes c units at now whether or not the bucket holds them: what was used beyond a reservation
// (an answer longer than it reserved) is still counted, and delays the takes after it.
func (b *Bucket) Force(now, c int64) {
	d := b.span(c)
	for {
		tat := b.tat.Load()
		if b.tat.CompareAndSwap(tat, max(tat, now)+d) {
			return
		}
	}
}

// Give gives back c units taken and not used (a reservation larger than the answer, a request refused by
// another limit after this one was taken). The TAT moves earlier, never before now: a bucket that filled
// up meanwhile stays full, not fuller.
func (b *Bucket) Give(now, c int64) {
	d := b.span(c)
	for {
		tat := b.tat.Load()
		if tat <= now {
			return
		}
		if b.tat.CompareAndSwap(tat, max(tat-d, now)) {
			return
		}
	}
}

// Remaining is how many units the bucket holds at now, of its share.
func (b *Bucket) Remaining(now int64) int64 {
	n := b.eff.Load()
	used := b.tat.Load() - now
	if used <= 0 {
		return n
	}
	if used >= Window {
		return 0
	}
	// (Window - used) x n / Window, in 128 bits.
	hi, lo := bits.Mul64(uint64(Window-used), uint64(n))
	q, _ := bits.Div64(hi, lo, uint64(Window))
	return int64(q)
}

// Reset is how long from now until the bucket is full again, in nanoseconds.
func (b *Bucket) Reset(now int64) int64 { return max(b.tat.Load()-now, 0) }
