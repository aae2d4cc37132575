package clientconn

import (
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestCoarseDeadline pins the rule: an armed deadline at most 1/deadlineSlack of the timeout later than
// the one asked for is kept; an earlier one, or one much later, is re-armed; past and zero deadlines are
// always applied; a deadline is never armed before the one asked for.
func TestCoarseDeadline(t *testing.T) {
	var d CoarseDeadline
	var armed []time.Time
	arm := func(t time.Time) error { armed = append(armed, t); return nil }
	now := time.Now()
	const timeout = 16 * time.Second

	_ = d.Set(now.Add(timeout), arm)
	if len(armed) != 1 || armed[0].Before(now.Add(timeout)) || armed[0].After(now.Add(timeout+time.Second+50*time.Millisecond)) {
		t.Fatalf("first arm %v, want within [now+16s, now+17s]", armed)
	}
	_ = d.Set(now.Add(timeout+500*time.Millisecond), arm) // the armed one is at most 1/16 later: kept
	if len(armed) != 1 {
		t.Fatalf("re-armed %v within the slack", armed[1:])
	}
	_ = d.Set(now.Add(timeout+2*time.Second), arm) // later than the armed one: re-armed
	if len(armed) != 2 || armed[1].Before(now.Add(timeout+2*time.Second)) {
		t.Fatalf("arms %v, want a second one no earlier than asked", armed)
	}
	_ = d.Set(now.Add(time.Second), arm) // much earlier than the armed one: re-armed, never late by more than 1/16
	if len(armed) != 3 || armed[2].Before(now.Add(time.Second)) || armed[2].After(now.Add(time.Second+time.Second/16+50*time.Millisecond)) {
		t.Fatalf("arms %v, want a third one within [now+1s, now+1.0625s]", armed)
	}
	_ = d.Set(time.Unix(1, 0), arm) // in the past (a wake-up): applied exactly
	if len(armed) != 4 || !armed[3].Equal(time.Unix(1, 0)) {
		t.Fatalf("arms %v, want the past deadline applied", armed)
	}
	_ = d.Set(time.Time{}, arm)
	_ = d.Set(time.Time{}, arm) // cleared once; the second clear has nothing to do
	if len(armed) != 5 || !armed[4].IsZero() {
		t.Fatalf("arms %v, want one clear", armed)
	}
	d.Forget(now.Add(time.Hour)) // SetDeadline armed both directions
	_ = d.Set(now.Add(timeout), arm)
	if len(armed) != 6 {
		t.Fatalf("arms %v: a deadline far before the forgotten one must be armed", armed)
	}
}

// TestClientConnCoarseDeadline: fasthttp's per-request deadlines reach the socket once per slack, and a
// read still times out, late by at most the slack.
func TestClientConnCoarseDeadline(t *testing.T) {
	nc := silentPeer(t)
	c := &clientConn{Conn: nc, raw: nc}
	start := time.Now()
	for i := 0; i < 100; i++ {
		if err := c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	armed := time.Unix(0, c.rd.armed.Load())
	if armed.Before(start.Add(200*time.Millisecond)) || armed.After(time.Now().Add(200*time.Millisecond+200*time.Millisecond/16)) {
		t.Fatalf("armed at %v after the start, want within [200ms, 212.5ms] of the last ask", armed.Sub(start))
	}
	var b [1]byte
	_, err := c.Read(b[:])
	waited := time.Since(start)
	if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
		t.Fatalf("read: %v, want a timeout", err)
	}
	if waited < 200*time.Millisecond {
		t.Fatalf("timed out after %v, before the 200ms asked for", waited)
	}
}

// TestReadDeadline pins the upstream read deadline's rule: switching between a long and a short timeout
// moves the socket's deadline only when it lies beyond the slack of the one asked for or has passed; an
// earlier one is kept, and its timeout is early - re-armed at the deadline asked for - until that one passes.
func TestReadDeadline(t *testing.T) {
	var d ReadDeadline
	var armed []time.Time
	arm := func(t time.Time) error { armed = append(armed, t); return nil }
	now := time.Now()
	const headers, gap = 16 * time.Second, 4 * time.Second

	_ = d.SetAfter(now, headers, arm)
	if len(armed) != 1 || !armed[0].Equal(now.Add(headers+headers/16)) {
		t.Fatalf("first arm %v, want now+17s", armed)
	}
	_ = d.SetAfter(now, gap, arm) // the armed deadline is beyond the slack: armed earlier
	if len(armed) != 2 || !armed[1].Equal(now.Add(gap+gap/16)) {
		t.Fatalf("arms %v, want a second one at now+4.25s", armed)
	}
	for i := range 3 { // the next requests: headers, gap, headers... no arm while the socket's is ahead
		_ = d.SetAfter(now.Add(time.Duration(i)*time.Millisecond), headers, arm)
		_ = d.SetAfter(now.Add(time.Duration(i)*time.Millisecond), gap, arm)
	}
	if len(armed) != 2 {
		t.Fatalf("switches armed %v", armed[2:])
	}
	_ = d.SetAfter(now, headers, arm)
	timeout := &net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}
	if !d.Early(timeout, arm) || len(armed) != 3 || !armed[2].Equal(now.Add(headers+headers/16)) {
		t.Fatalf("early timeout: arms %v, want the asked deadline armed", armed)
	}
	if d.Early(io.EOF, arm) || len(armed) != 3 {
		t.Fatal("another error counted as an early timeout")
	}
	_ = d.SetAfter(now.Add(-time.Minute), time.Second, arm) // asked for a deadline that has passed
	if d.Early(timeout, arm) {
		t.Fatal("the timeout of the deadline asked for counted as early")
	}
	if len(armed) != 4 {
		t.Fatalf("arms %v: a socket deadline that has passed must be re-armed", armed)
	}
}

// silentPeer returns a loopback TCP connection whose peer never writes; both close when the test ends.
func silentPeer(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	return nc
}
