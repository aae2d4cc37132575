package clientconn

import (
	"errors"
	"os"
	"sync/atomic"
	"time"
)

// deadlineSlack is how late, as a fraction of the timeout asked for, a coarse deadline may fire: 1/16, so a
// 60 s idle timeout closes a connection between 60 and 63.75 s and a 120 s body gap times out between 120
// and 127.5 s.
const deadlineSlack = 16

// CoarseDeadline arms one direction of a socket's deadline, skipping the arm when the deadline already armed
// is at most 1/deadlineSlack of the timeout later than the one asked for. Arming moves the runtime's timer
// under the poller's lock; the server asks for a read deadline twice per request, the upstream connection
// for a write deadline once per request, nearly always microseconds after the last.
// Armed a little late, one arm lasts many requests or chunks.
//
// A deadline asked for in the past (to wake a parked read) and a cleared one are always applied, and one
// asked earlier than the armed deadline by more than the slack is armed exactly, so a timeout never fires
// early and at most 1/deadlineSlack of it late. Every arm of the direction must go through it (the
// SetDeadline that arms both directions too, through Forget), or it would trust a deadline no longer armed.
type CoarseDeadline struct {
	armed atomic.Int64 // Unix ns of the deadline armed; 0: none
}

// Set arms t (zero: none) with arm unless the armed deadline is close enough after it.
func (d *CoarseDeadline) Set(t time.Time, arm func(time.Time) error) error {
	if t.IsZero() {
		if d.armed.Load() == 0 {
			return nil
		}
		d.armed.Store(0)
		return arm(t)
	}
	return d.armAt(t.UnixNano(), t.UnixNano()-time.Now().UnixNano(), arm)
}

// SetAfter arms the deadline timeout after now (a time the caller has just read), like Set.
func (d *CoarseDeadline) SetAfter(now time.Time, timeout time.Duration, arm func(time.Time) error) error {
	return d.armAt(now.UnixNano()+int64(timeout), int64(timeout), arm)
}

// armAt arms the deadline want (Unix ns), ahead ns from now, unless the armed one is close enough after it.
func (d *CoarseDeadline) armAt(want, ahead int64, arm func(time.Time) error) error {
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

// Forget records that the direction was armed at t by other means.
func (d *CoarseDeadline) Forget(t time.Time) {
	if t.IsZero() {
		d.armed.Store(0)
		return
	}
	d.armed.Store(t.UnixNano())
}

// ReadDeadline is the upstream connection's read deadline, which switches between two timeouts on every
// request: the wait for the answer's headers (timeouts.headers_secs) and the gap between body reads
// (timeouts.idle_secs). A CoarseDeadline would move the socket's timer twice per request, at each switch.
// ReadDeadline also keeps a socket deadline that comes before the one asked for: the read that times out
// then asks early, which tells a real timeout from an early one and, for an early one, arms the socket
// at the deadline asked for, so that the reader reads again. A timeout is thus never reported early and at
// most 1/deadlineSlack of it late, and a switch moves no timer unless the socket's deadline has passed or
// lies more than the slack beyond the one asked for.
//
// It is used by one goroutine at a time, like the connection.
type ReadDeadline struct {
	want  int64 // Unix ns of the deadline asked for; 0: none
	late  int64 // want plus its slack: where the socket is armed when it must be
	armed int64 // Unix ns of the socket's deadline; 0: none or unknown
}

// SetAfter asks for the deadline timeout after now (a time the caller has just read).
func (d *ReadDeadline) SetAfter(now time.Time, timeout time.Duration, arm func(time.Time) error) error {
	n := now.UnixNano()
	d.want = n + int64(timeout)
	d.late = d.want + int64(timeout)/deadlineSlack
	if d.armed > n && d.armed <= d.late {
		return nil
	}
	return d.arm(arm)
}

func (d *ReadDeadline) arm(arm func(time.Time) error) error {
	if err := arm(time.Unix(0, d.late)); err != nil {
		d.armed = 0
		return err
	}
	d.armed = d.late
	return nil
}

// Early reports whether err, returned by a read, is the timeout of a socket deadline armed before the
// deadline asked for, and then arms the socket at that one: the caller reads again. A timeout of the
// deadline asked for, or any other error, is the read's to report.
func (d *ReadDeadline) Early(err error, arm func(time.Time) error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || d.want == 0 || time.Now().UnixNano() >= d.want {
		return false
	}
	return d.arm(arm) == nil
}
