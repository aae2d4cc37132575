//go:build cgo

package kvindex

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// waitSubscribedTo waits until the subscriptions to topics reached p, skipping the others: every
// publisher of a shared endpoint receives the subscriptions of all its targets.
func (p *testPub) waitSubscribedTo(topics ...string) {
	p.t.Helper()
	for len(topics) > 0 {
		msg, err := p.sock.RecvBytes(0)
		if err != nil || len(msg) == 0 {
			p.t.Fatalf("no subscription to %q arrived: %q %v", topics, msg, err)
		}
		if i := slices.Index(topics, string(msg[1:])); msg[0] == 1 && i >= 0 {
			topics = slices.Delete(topics, i, i+1)
		}
	}
}

// settled waits until the socket's goroutine took its latest targets in.
func (rd *reader) settled(t *testing.T) {
	t.Helper()
	waitFor(t, "the socket to take its targets in", func() bool { return rd.applied.Load() == rd.gen.Load() })
}

// runTokens are the tokens of the one block engine (or run) e publishes at seq: distinct for every pair.
func runTokens(e int, seq uint64) []uint32 {
	v := uint32(e)<<16 | uint32(seq)
	return []uint32{v, v}
}

// runPayload is the batch engine e publishes at seq: one root block of runTokens(e, seq).
func runPayload(e int, seq uint64) []byte {
	return batchOf(storedEvent([]uint64{uint64(e)<<32 | seq}, 0, runTokens(e, seq), 2))
}

// holders returns the targets (of n) the block engine e published at seq is resident on.
func holders(ix *Index, n, e int, seq uint64) []int {
	out, _ := matchAll(ix, runTokens(e, seq), n)
	var on []int
	for t, blocks := range out {
		if blocks == 1 {
			on = append(on, t)
		}
	}
	return on
}

func (s *Subscriber) sockets() []*reader {
	s.mu.Lock()
	defer s.mu.Unlock()
	var rds []*reader
	for rd := range s.readers {
		rds = append(rds, rd)
	}
	return rds
}

// TestSubscriberSharedBind: four engines connect to one bound endpoint (llm-d style) and each is ingested
// under its own target, with its own sequence and index; a reload that replaces one target's subscription,
// or removes one, keeps the socket (and the other engines' streams) as they are.
func TestSubscriberSharedBind(t *testing.T) {
	zctx := newTestContext(t)
	ix := NewIndex(5)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	// llm-d's topics; 10.0.0.1 is a prefix of 10.0.0.11's, which the longest match tells apart.
	topics := []string{"kv@10.0.0.1", "kv@10.0.0.11", "kv@10.0.0.2", "kv@10.0.0.3"}
	streams := make([]*Stream, 5)
	for e, topic := range topics {
		st, err := s.Add(e, SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: topic})
		if err != nil {
			t.Fatalf("cannot add target %d: %s", e, err)
		}
		streams[e] = st
	}
	if n := len(s.sockets()); n != 1 {
		t.Fatalf("four targets on one bind endpoint opened %d sockets; want 1", n)
	}
	socket := s.sockets()[0]
	s.Start(context.Background())
	pubs := make([]*testPub, len(topics))
	for e, topic := range topics {
		pubs[e] = newTestPub(t, zctx, endpoint)
		pubs[e].waitSubscribedTo(topic)
	}
	// Engine e publishes its own run, 0..e+2, interleaved with the others; the topic frame carries more
	// than the configured prefix, as llm-d's kv@<ip>:<port>@<model> does.
	last := func(e int) uint64 { return uint64(e) + 2 }
	send := func(e int, seq uint64) {
		t.Helper()
		pubs[e].send([]byte(topics[e]+":8000@m"), be64(seq), runPayload(e, seq))
	}
	for seq := uint64(0); seq <= last(3); seq++ {
		for e := range topics {
			if seq <= last(e) {
				send(e, seq)
			}
		}
	}
	for e := range topics {
		waitFor(t, fmt.Sprintf("engine %d's run", e), func() bool { return streams[e].Stats().LastSeq == last(e) })
	}
	f := func(target int, st *Stream, batches, blocks uint64) {
		t.Helper()
		stats := st.Stats()
		if !stats.Trusted || stats.Trust != TrustExact || stats.Batches != batches || uint64(stats.Blocks) != blocks ||
			stats.Gaps != 0 || stats.Restarts != 0 || stats.Disconnects != 0 || stats.GarbageFrames != 0 {
			t.Fatalf("target %d: unexpected stats %+v; want exact, %d batches, %d blocks", target, stats, batches, blocks)
		}
	}
	for e := range topics {
		f(e, streams[e], last(e)+1, last(e)+1)
		for seq := uint64(0); seq <= last(e); seq++ {
			if on := holders(ix, 5, e, seq); len(on) != 1 || on[0] != e {
				t.Fatalf("engine %d's block of seq %d is resident on targets %v; want [%d]", e, seq, on, e)
			}
		}
	}

	// A reload changes engine 2's settings: its new subscription (target 4) comes before the old one is
	// removed, and both are fed meanwhile.
	st4, err := s.Add(4, SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: topics[2], StaleAfter: time.Hour})
	if err != nil {
		t.Fatalf("cannot add the replacement: %s", err)
	}
	if rds := s.sockets(); len(rds) != 1 || rds[0] != socket {
		t.Fatalf("the replacement opened a socket of its own")
	}
	// The socket subscribes a topic once, however many targets have it: no new subscription to wait for,
	// only the reader's next turn.
	socket.settled(t)
	send(2, 5)
	waitFor(t, "seq 5 on both", func() bool { return streams[2].Stats().LastSeq == 5 && st4.Stats().LastSeq == 5 })
	s.Remove(2)
	// And the reload removes engine 3 altogether.
	s.Remove(3)
	if rds := s.sockets(); len(rds) != 1 || rds[0] != socket {
		t.Fatalf("removing two targets of a shared socket closed or replaced it")
	}
	socket.settled(t)
	send(0, last(0)+1)
	send(1, last(1)+1)
	send(2, 6)
	send(3, last(3)+1) // unsubscribed: not delivered, or dropped if in flight
	waitFor(t, "the next batches", func() bool {
		return streams[0].Stats().LastSeq == last(0)+1 && streams[1].Stats().LastSeq == last(1)+1 && st4.Stats().LastSeq == 6
	})
	f(0, streams[0], last(0)+2, last(0)+2)
	f(1, streams[1], last(1)+2, last(1)+2)
	// The replacement joined late (seq 5) and went on contiguously.
	f(4, st4, 2, 2)
	if st := streams[3].Stats(); st.Batches != last(3)+1 || st.Blocks != 0 {
		t.Fatalf("the removed target went on: %+v", st)
	}
	if on := holders(ix, 5, 2, 6); len(on) != 1 || on[0] != 4 {
		t.Fatalf("engine 2's new block is resident on %v; want [4]", on)
	}
}

// TestSubscriberSharedBindSettingsChange: a target whose socket settings differ from those of the socket
// bound to its endpoint (a reload that changes allowed_publishers) gets a socket of its own, which binds
// once the old one closed: the old subscription goes on meanwhile.
func TestSubscriberSharedBindSettingsChange(t *testing.T) {
	zctx := newTestContext(t)
	ix := NewIndex(2)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	old, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: "kv@a"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	pub := newTestPub(t, zctx, endpoint)
	pub.waitSubscribedTo("kv@a")
	pub.send([]byte("kv@a"), be64(0), runPayload(0, 0))
	waitFor(t, "seq 0", func() bool { return old.Stats().HasSeq })
	cur, err := s.Add(1, SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: "kv@a", AllowedPublishers: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if n := len(s.sockets()); n != 2 {
		t.Fatalf("%d sockets; want 2 (the new settings cannot join the old socket)", n)
	}
	pub.send([]byte("kv@a"), be64(1), runPayload(0, 1))
	waitFor(t, "seq 1 on the old subscription", func() bool { return old.Stats().LastSeq == 1 })
	if cur.Stats().HasSeq {
		t.Fatalf("the new socket received while the old one holds the address")
	}
	s.Remove(0)
	// The publisher reconnects to the new socket, which binds at once (Remove woke it).
	pub.waitSubscribedTo("kv@a")
	pub.send([]byte("kv@a"), be64(2), runPayload(0, 2))
	waitFor(t, "seq 2 on the new subscription", func() bool { return cur.Stats().LastSeq == 2 })
	if st := cur.Stats(); !st.Trusted || st.AuthRefused != 0 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

// trustPath polls st.Trust until it reads s/r: the request path's view, while the applier works.
func trustPath(t *testing.T, st *Stream, s TrustState, r TrustReason) {
	t.Helper()
	waitFor(t, s.String()+"/"+r.String(), func() bool { return trustIs(st, s, r) })
}

// TestSubscriberTrustCleared: AllBlocksCleared over real sockets empties the target's index; the state
// is exact/cleared until the engine stores again, then exact.
func TestSubscriberTrustCleared(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	ix := NewIndex(2)
	s := newTestSubscriber(t, ix)
	other, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, Topic: "other"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	st, err := s.Add(1, SubscriberConfig{Endpoint: pub.endpoint, Topic: "kv"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	tr := watchTrust(st)
	s.Start(context.Background())
	pub.waitSubscribedTo("kv", "other")
	pub.send([]byte("other"), be64(0), runPayload(0, 0))
	pub.send([]byte("kv"), be64(0), runPayload(1, 0))
	pub.send([]byte("kv"), be64(1), runPayload(1, 1))
	waitFor(t, "seq 1", func() bool { return st.Stats().LastSeq == 1 && other.Stats().HasSeq })
	pub.send([]byte("kv"), be64(2), batchOf(clearedEvent()))
	trustPath(t, st, TrustExact, ReasonCleared)
	if stats := st.Stats(); stats.Blocks != 0 || stats.ClearedEvents != 1 || len(holders(ix, 2, 1, 0)) != 0 {
		t.Fatalf("AllBlocksCleared left blocks: %+v", stats)
	}
	if on := holders(ix, 2, 0, 0); len(on) != 1 || on[0] != 0 {
		t.Fatalf("AllBlocksCleared of target 1 touched target 0: its block is on %v", on)
	}
	pub.send([]byte("kv"), be64(3), runPayload(1, 3))
	trustPath(t, st, TrustExact, ReasonNone)
	tr.want(t, "cleared", "exact/", "exact/cleared", "exact/")
}

// TestSubscriberTrustGapReplay: a sequence gap over real sockets is degraded while the replay runs (the
// request path reads degraded/replaying meanwhile) and exact once it healed the gap.
func TestSubscriberTrustGapReplay(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	hold := make(chan struct{})
	rs := serveReplay(t, zctx, replayOpts{layout: "post", topic: "kv", seqs: []uint64{0, 1, 2, 3, 4}, hold: hold})
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	s.replayTimeout = 20 * time.Second
	st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, ReplayEndpoint: rs.endpoint})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	tr := watchTrust(st)
	if s, r := st.Trust(); s != TrustFallback || r != ReasonNoEventsYet {
		t.Fatalf("a new stream is %s/%s; want fallback/no_events_yet", s, r)
	}
	s.Start(context.Background())
	pub.waitSubscribed()
	pub.publish("kv", 0, 1, 4)
	trustPath(t, st, TrustDegraded, ReasonReplaying)
	close(hold)
	trustPath(t, st, TrustExact, ReasonNone)
	tr.want(t, "gap", "exact/", "degraded/gap", "degraded/replaying", "exact/")
	for seq := uint64(0); seq <= 4; seq++ {
		if !residentOn(ix, 0, seq) {
			t.Fatalf("block of seq %d is not resident after the replay", seq)
		}
	}
	if stats := st.Stats(); stats.Gaps != 1 || stats.ReplaysOK != 1 || stats.LastSeq != 4 {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

// TestSubscriberTrustPublisherRestart: an engine that restarts (its publisher reconnects to the bound
// endpoint and numbers from 0 again) clears the target, which is exact again from the new run's first
// batch; one seen first at a later sequence is rebuilt by a replay from 0.
func TestSubscriberTrustPublisherRestart(t *testing.T) {
	zctx := newTestContext(t)
	// The third run's replay buffer.
	rs := serveReplay(t, zctx, replayOpts{layout: "post", topic: "kv@e", seqs: []uint64{0, 1, 2, 3},
		payload: func(seq uint64) []byte { return runPayload(3, seq) }})
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	st, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind", Topic: "kv@e", ReplayEndpoint: rs.endpoint})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	tr := watchTrust(st)
	s.Start(context.Background())
	run := func(r int, seqs ...uint64) {
		t.Helper()
		pub := newTestPub(t, zctx, endpoint)
		pub.waitSubscribedTo("kv@e")
		for _, seq := range seqs {
			pub.send([]byte("kv@e"), be64(seq), runPayload(r, seq))
		}
		waitFor(t, fmt.Sprintf("run %d", r), func() bool {
			stats := st.Stats()
			return stats.LastSeq == seqs[len(seqs)-1] && stats.Restarts == uint64(r-1)
		})
		// The engine goes away.
		_ = pub.sock.Close()
	}
	resident := func(r int, from, to uint64) {
		t.Helper()
		for rr := 1; rr <= 3; rr++ {
			for seq := uint64(0); seq < 6; seq++ {
				want := rr == r && seq >= from && seq <= to
				if got := len(holders(ix, 1, rr, seq)) == 1; got != want {
					t.Fatalf("block of run %d, seq %d: resident=%v; want %v", rr, seq, got, want)
				}
			}
		}
	}
	run(1, 0, 1, 2, 3, 4, 5)
	trustPath(t, st, TrustExact, ReasonNone)
	resident(1, 0, 5)
	tr.want(t, "first run", "exact/")
	// Restarted: numbers from 0 again. The old run's blocks are gone, the new run is exact from its start.
	run(2, 0, 1, 2, 3, 4)
	trustPath(t, st, TrustExact, ReasonNone)
	resident(2, 0, 4)
	tr.want(t, "restart from 0", "fallback/publisher_restart", "exact/")
	// Restarted again, its first batches lost (slow joiner): seen at 3, below the last run's 4 (one seen
	// above it is a gap: the sequence alone cannot tell), rebuilt by a replay from 0.
	run(3, 3)
	trustPath(t, st, TrustExact, ReasonNone)
	resident(3, 0, 3)
	tr.want(t, "restart seen late", "fallback/publisher_restart", "degraded/replaying", "exact/")
	if stats := st.Stats(); stats.Restarts != 2 || stats.ReplaysOK != 1 || stats.Gaps != 0 {
		t.Fatalf("unexpected stats %+v", stats)
	}
}
