package engine

import (
	"sync/atomic"
	"time"
)

// deadlineSlack is how late, as a fraction of the timeout asked for, a coarse deadline may fire: 1/16, so a
// 60 s idle timeout closes a connection between 60 and 63.75 s and a 120 s body gap times out between 120
// and 127.5 s.
const deadlineSlack = 16

// coarseDeadline arms one direction of a socket's deadline, skipping the arm when the deadline already armed
// is at most 1/deadlineSlack of the timeout later than the one asked for. Arming moves the runtime's timer
// under the poller's lock; the server asks for a read deadline twice per request, the upstream connection
// for three deadlines per request and one per streamed chunk, nearly always microseconds after the last.
// Armed a little late, one arm lasts many requests or chunks.
//
// A deadline asked for in the past (to wake a parked read) and a cleared one are always applied, and one
// asked earlier than the armed deadline by more than the slack is armed exactly, so a timeout never fires
// early and at most 1/deadlineSlack of it late. Every arm of the direction must go through it (the
// SetDeadline that arms both directions too, through forget), or it would trust a deadline no longer armed.
type coarseDeadline struct {
	armed atomic.Int64 // Unix ns of the deadline armed; 0: none
}

// set arms t (zero: none) with arm unless the armed deadline is close enough after it.
func (d *coarseDeadline) set(t time.Time, arm func(time.Time) error) error {
	if t.IsZero() {
		if d.armed.Load() == 0 {
			return nil
		}
		d.armed.Store(0)
		return arm(t)
	}
	return d.armAt(t.UnixNano(), t.UnixNano()-time.Now().UnixNano(), arm)
}

// setAfter arms the deadline timeout after now (a time the caller has just read), like set.
func (d *coarseDeadline) setAfter(now time.Time, timeout time.Duration, arm func(time.Time) error) error {
	return d.armAt(now.UnixNano()+int64(timeout), int64(timeout), arm)
}

// armAt arms the deadline want (Unix ns), ahead ns from now, unless the armed one is close enough after it.
func (d *coarseDeadline) armAt(want, ahead int64, arm func(time.Time) error) error {
	t := time.Unix(0, want)
	if ahead > 0 {
		slack := ahead / deadlineSlack
		if a := d.armed.Load(); a >= want && a-want <= slack {
			return nil
		}
		// Armed at the far end of the slack, so that the asks that follow skip for as long as possible.
		want += slack
		t = time.Unix(0, want)
	}
	if err := arm(t); err != nil {
		d.armed.Store(0) // unknown: the next ask arms
		return err
	}
	d.armed.Store(want)
	return nil
}

// forget records that the direction was armed at t by other means.
func (d *coarseDeadline) forget(t time.Time) {
	if t.IsZero() {
		d.armed.Store(0)
		return
	}
	d.armed.Store(t.UnixNano())
}
