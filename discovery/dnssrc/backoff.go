package dnssrc

import "time"

// backoff spaces out the retries of a failing source: min, then twice as long each time, up to max. The
// zero wait after reset starts again at min.
type backoff struct {
	min, max time.Duration
	next     time.Duration
}

// wait returns how long to wait before the next retry, and doubles the one after.
func (b *backoff) wait() time.Duration {
	if b.next == 0 {
		b.next = b.min
	}
	d := b.next
	b.next = min(2*b.next, b.max)
	return d
}

// reset starts the next run of failures at min again.
func (b *backoff) reset() { b.next = 0 }
