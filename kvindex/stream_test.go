package kvindex

import (
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"
)

// seqPayload is the batch published at seq: one root block [seq, seq] with engine hash 1000+seq.
func seqPayload(seq uint64) []byte {
	return batchOf(storedEvent([]uint64{1000 + seq}, 0, []uint32{uint32(seq), uint32(seq)}, 2))
}

// fakeReplayer serves the batches it holds, like vLLM's ROUTER buffer.
type fakeReplayer struct {
	batches map[uint64][]byte
	err     error
	calls   []uint64
}

func newFakeReplayer(seqs ...uint64) *fakeReplayer {
	r := &fakeReplayer{batches: map[uint64][]byte{}}
	for _, s := range seqs {
		r.batches[s] = seqPayload(s)
	}
	return r
}

func (r *fakeReplayer) Replay(start uint64, fn func(seq uint64, payload []byte)) error {
	r.calls = append(r.calls, start)
	var seqs []uint64
	for s := range r.batches {
		if s >= start {
			seqs = append(seqs, s)
		}
	}
	slices.Sort(seqs)
	for _, s := range seqs {
		fn(s, r.batches[s])
	}
	return r.err
}

type streamHarness struct {
	t   *testing.T
	ix  *Index
	st  *Stream
	now time.Time
}

func newHarness(t *testing.T, cfg StreamConfig) *streamHarness {
	ix := NewIndex(1)
	return &streamHarness{t: t, ix: ix, st: NewStream(ix.Target(0, 0), cfg), now: time.Unix(1700000000, 0)}
}

func (h *streamHarness) pub(seqs ...uint64) {
	for _, s := range seqs {
		h.now = h.now.Add(time.Second)
		h.st.Handle(nil, s, seqPayload(s), h.now)
	}
}

// resident reports whether the block published at seq is resident.
func (h *streamHarness) resident(seq uint64) bool {
	out, _ := matchAll(h.ix, []uint32{uint32(seq), uint32(seq)}, 1)
	return out[0] == 1
}

func (h *streamHarness) wantResident(seqs ...uint64) {
	h.t.Helper()
	for s := uint64(0); s < 20; s++ {
		if got, want := h.resident(s), slices.Contains(seqs, s); got != want {
			h.t.Fatalf("block of seq %d: resident=%v; want %v", s, got, want)
		}
	}
}

func (h *streamHarness) wantTrust(s TrustState, r TrustReason) {
	h.t.Helper()
	gs, gr := h.st.Trust()
	if gs != s || gr != r {
		h.t.Fatalf("trust %s/%s; want %s/%s", gs, gr, s, r)
	}
	if h.st.Trusted() != (s == TrustExact) {
		h.t.Fatalf("Trusted() = %v in state %s", h.st.Trusted(), gs)
	}
}

func TestStreamContiguousAndLateJoin(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.wantTrust(TrustFallback, ReasonNoEventsYet)
	h.pub(5) // a late joiner is not a gap
	h.wantTrust(TrustExact, ReasonNone)
	h.pub(6, 7)
	h.wantResident(5, 6, 7)
	st := h.st.Stats()
	if st.Gaps != 0 || st.Batches != 3 || st.LastSeq != 7 || !st.HasSeq || st.Blocks != 3 || st.StoredEvents != 3 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamGapWithoutReplay(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0, 1, 2, 5)
	h.wantTrust(TrustFallback, ReasonGap)
	// The index was cleared (batches 3 and 4 may hold removals) and applied batch 5.
	h.wantResident(5)
	h.pub(6)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(5, 6)
	if st := h.st.Stats(); st.Gaps != 1 || st.LostBatches != 2 || st.Clears != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamGapReplay(t *testing.T) {
	rp := newFakeReplayer(0, 1, 2, 3, 4, 5, 6)
	h := newHarness(t, StreamConfig{Replayer: rp})
	h.pub(0, 1, 4)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(0, 1, 2, 3, 4)
	h.pub(5)
	h.wantResident(0, 1, 2, 3, 4, 5)
	if !slices.Equal(rp.calls, []uint64{2}) {
		t.Fatalf("unexpected replay calls %v", rp.calls)
	}
	if st := h.st.Stats(); st.Gaps != 1 || st.ReplaysOK != 1 || st.ReplaysFailed != 0 || st.Clears != 0 || st.LastSeq != 5 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamGapReplayFails(t *testing.T) {
	f := func(rp *fakeReplayer) {
		t.Helper()
		h := newHarness(t, StreamConfig{Replayer: rp})
		h.pub(0, 1, 4)
		h.wantTrust(TrustFallback, ReasonGap)
		h.wantResident(4)
		if st := h.st.Stats(); st.ReplaysFailed != 1 || st.ReplaysOK != 0 {
			t.Fatalf("unexpected stats %+v", st)
		}
		h.pub(5)
		h.wantTrust(TrustExact, ReasonNone)
	}
	// The buffer no longer holds seq 2.
	f(newFakeReplayer(3, 4))
	// The replay breaks after seq 2.
	rp := newFakeReplayer(2)
	rp.err = errors.New("timeout")
	f(rp)
	// A replayed batch does not decode.
	rp = newFakeReplayer(2, 3)
	rp.batches[3] = []byte{0xc1}
	f(rp)
}

func TestStreamRestart(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0, 1, 2, 0)
	// A publisher starting over at 0 has an empty cache and we see it from its first batch.
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(0)
	h.pub(1, 2, 3, 7, 8, 9, 4)
	// Back to 4 without replay: cleared, untrusted until the next contiguous batch.
	h.wantTrust(TrustFallback, ReasonPublisherRestart)
	h.wantResident(4)
	h.pub(5)
	h.wantTrust(TrustExact, ReasonNone)
	// llm-d-inference-sim numbers from 1.
	h.pub(1)
	h.wantTrust(TrustExact, ReasonNone)
	if st := h.st.Stats(); st.Restarts != 3 || st.Gaps != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamRestartReplay(t *testing.T) {
	rp := newFakeReplayer()
	h := newHarness(t, StreamConfig{Replayer: rp})
	h.pub(0, 1, 2, 3, 4, 5, 6)
	// The engine restarted; its new run is at 3 when we notice, and its buffer holds 0..3.
	rp.batches = newFakeReplayer(0, 1, 2, 3).batches
	h.pub(3)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(0, 1, 2, 3)
	if st := h.st.Stats(); st.Restarts != 1 || st.ReplaysOK != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamLateJoinReplay(t *testing.T) {
	f := func(buffered []uint64, wantSynced bool) {
		t.Helper()
		h := newHarness(t, StreamConfig{Replayer: newFakeReplayer(buffered...)})
		h.pub(5)
		h.wantTrust(TrustExact, ReasonNone)
		h.wantResident(append(slices.Clone(buffered), 5)...)
		if h.st.Target().synced != wantSynced {
			t.Fatalf("buffered %v: synced=%v; want %v", buffered, h.st.Target().synced, wantSynced)
		}
	}
	f([]uint64{0, 1, 2, 3, 4}, true) // vLLM numbers from 0
	f([]uint64{1, 2, 3, 4}, true)    // llm-d-inference-sim from 1
	// The buffer lost the start: the late join still stands, with an empty index.
	h := newHarness(t, StreamConfig{Replayer: newFakeReplayer(3, 4)})
	h.pub(5)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(5)
}

func TestStreamMalformed(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0, 1)
	h.st.Handle(nil, 2, []byte{0x93, 0x01}, h.now)
	h.wantTrust(TrustFallback, ReasonMismatch)
	h.wantResident()
	h.pub(3)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(3)
	if st := h.st.Stats(); st.DecodeErrors != 1 || st.LastSeq != 3 || st.Gaps != 0 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamGarbageFrames(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0)
	f := func(frames ...[]byte) {
		t.Helper()
		h.st.HandleFrames(frames, h.now)
	}
	f([]byte("topic"), be64(1))
	f([]byte("topic"), []byte{0, 0, 1}, seqPayload(1))
	f([]byte("topic"), be64(1), seqPayload(1), nil)
	f()
	h.wantTrust(TrustExact, ReasonNone)
	f(nil, be64(1), seqPayload(1))
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(0, 1)
	if st := h.st.Stats(); st.GarbageFrames != 4 || st.Batches != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamStale(t *testing.T) {
	h := newHarness(t, StreamConfig{StaleAfter: 10 * time.Second})
	h.st.Tick(h.now.Add(time.Hour)) // nothing received yet: waiting, not stale
	h.wantTrust(TrustFallback, ReasonNoEventsYet)
	h.pub(0)
	h.st.Tick(h.now.Add(9 * time.Second))
	h.wantTrust(TrustExact, ReasonNone)
	h.st.Tick(h.now.Add(10 * time.Second))
	h.wantTrust(TrustFallback, ReasonStale)
	h.st.Tick(h.now.Add(20 * time.Second))
	h.now = h.now.Add(30 * time.Second)
	h.pub(1)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(0, 1)
	if st := h.st.Stats(); st.StaleTransitions != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Staleness ends with any message; a gap after it is still a gap.
	h.st.Tick(h.now.Add(time.Minute))
	h.now = h.now.Add(2 * time.Minute)
	h.pub(5)
	h.wantTrust(TrustFallback, ReasonGap)
}

func TestStreamUnknownParent(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0)
	orphan := batchOf(storedEvent([]uint64{77}, 76, []uint32{1, 2}, 2))
	h.st.Handle(nil, 1, orphan, h.now)
	h.wantTrust(TrustFallback, ReasonMismatch)
	h.wantResident()
	h.pub(2)
	h.wantTrust(TrustExact, ReasonNone)
	// After the clear the engine may hold blocks the index never saw: orphans are expected now.
	h.st.Handle(nil, 3, orphan, h.now)
	h.wantTrust(TrustExact, ReasonNone)
	if st := h.st.Stats(); st.MissedEvents != 1 || st.UnknownParents != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamAllBlocksCleared(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(3, 4)
	h.st.Handle(nil, 5, batchOf(clearedEvent()), h.now)
	// The engine emptied its cache and the index with it: exact, and the reason says why it is empty.
	h.wantTrust(TrustExact, ReasonCleared)
	h.wantResident()
	if st := h.st.Stats(); st.Blocks != 0 || st.ClearedEvents != 1 || !st.Trusted || st.Reason != ReasonCleared {
		t.Fatalf("unexpected stats %+v", st)
	}
	// A batch that stores nothing keeps the reason; the first stored block ends it.
	h.st.Handle(nil, 6, batchOf(removedEvent(1003)), h.now)
	h.wantTrust(TrustExact, ReasonCleared)
	h.pub(7)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(7)
	// Cleared and stored again within one batch: exact, nothing to explain.
	h.st.Handle(nil, 8, batchOf(clearedEvent(), storedEvent([]uint64{1008}, 0, []uint32{8, 8}, 2)), h.now)
	h.wantTrust(TrustExact, ReasonNone)
	h.wantResident(8)
	// After AllBlocksCleared the index knows the whole (empty) cache, so an orphan proves missed events.
	h.st.Handle(nil, 9, batchOf(clearedEvent()), h.now)
	h.st.Handle(nil, 10, batchOf(storedEvent([]uint64{77}, 76, []uint32{1, 2}, 2)), h.now)
	h.wantTrust(TrustFallback, ReasonMismatch)
}

func TestStreamAllBlocksClearedEndsDoubt(t *testing.T) {
	// A batch holding AllBlocksCleared makes the index exact at once, whatever was lost before it: from the
	// event on it has seen everything the engine's cache went through.
	h := newHarness(t, StreamConfig{})
	h.pub(0, 1)
	h.st.Handle(nil, 4, batchOf(storedEvent([]uint64{1004}, 0, []uint32{4, 4}, 2), clearedEvent()), h.now)
	h.wantTrust(TrustExact, ReasonCleared)
	h.wantResident()
	// A restart whose first batch seen is not the publisher's first: the same.
	h.st.Handle(nil, 2, batchOf(clearedEvent()), h.now)
	h.wantTrust(TrustExact, ReasonCleared)
	if st := h.st.Stats(); st.Gaps != 1 || st.Restarts != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

// transitions records a stream's trust transitions (Stream.observe), safe for a reader goroutine.
type transitions struct {
	mu  sync.Mutex
	got []string
}

func watchTrust(st *Stream) *transitions {
	tr := &transitions{}
	st.observe = func(s TrustState, r TrustReason) {
		tr.mu.Lock()
		tr.got = append(tr.got, s.String()+"/"+r.String())
		tr.mu.Unlock()
	}
	return tr
}

// take returns the transitions recorded since the last take.
func (tr *transitions) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	got := tr.got
	tr.got = nil
	return got
}

func (tr *transitions) want(t *testing.T, what string, want ...string) {
	t.Helper()
	if got := tr.take(); !slices.Equal(got, want) {
		t.Fatalf("%s: transitions %q; want %q", what, got, want)
	}
}

func TestStreamTrustTransitions(t *testing.T) {
	// Every path of doc.go's "Trust" table, transient states included.
	f := func(name string, rp *fakeReplayer, before, after []uint64, want ...string) {
		t.Helper()
		cfg := StreamConfig{}
		if rp != nil {
			cfg.Replayer = rp
		}
		h := newHarness(t, cfg)
		h.pub(before...)
		tr := watchTrust(h.st)
		h.pub(after...)
		tr.want(t, name, want...)
	}
	f("first batch", nil, nil, []uint64{0}, "exact/")
	f("late join, replayed", newFakeReplayer(0, 1, 2), nil, []uint64{3}, "degraded/replaying", "exact/")
	f("gap, replayed", newFakeReplayer(2, 3), []uint64{0, 1}, []uint64{4}, "degraded/gap", "degraded/replaying", "exact/")
	f("gap, replay failed", newFakeReplayer(3), []uint64{0, 1}, []uint64{4, 5},
		"degraded/gap", "degraded/replaying", "fallback/gap", "exact/")
	f("gap, no replay", nil, []uint64{0, 1}, []uint64{4, 5}, "degraded/gap", "fallback/gap", "exact/")
	f("restart from 0", nil, []uint64{0, 1, 2}, []uint64{0}, "fallback/publisher_restart", "exact/")
	f("restart, replayed", newFakeReplayer(0, 1), []uint64{5, 6}, []uint64{2}, "fallback/publisher_restart", "degraded/replaying", "exact/")
	f("restart, replay failed", newFakeReplayer(0), []uint64{5, 6}, []uint64{2, 3},
		"fallback/publisher_restart", "degraded/replaying", "fallback/publisher_restart", "exact/")
	f("restart, no replay", nil, []uint64{5, 6}, []uint64{2, 3}, "fallback/publisher_restart", "exact/")

	h := newHarness(t, StreamConfig{StaleAfter: time.Second})
	tr := watchTrust(h.st)
	h.pub(0)
	h.st.Tick(h.now.Add(time.Second))
	h.pub(1)
	h.st.dropped()
	h.pub(2)
	h.st.Handle(nil, 3, []byte{0xc1}, h.now)
	h.pub(4)
	h.st.Handle(nil, 5, batchOf(clearedEvent()), h.now)
	h.pub(6)
	tr.want(t, "stale, drop, mismatch, cleared", "exact/", "fallback/stale", "exact/", "degraded/gap", "exact/",
		"fallback/mismatch", "exact/", "exact/cleared", "exact/")
}

func TestTrustStrings(t *testing.T) {
	f := func(got, want string) {
		t.Helper()
		if got != want {
			t.Fatalf("got %q; want %q", got, want)
		}
	}
	f(TrustExact.String(), "exact")
	f(TrustDegraded.String(), "degraded")
	f(TrustFallback.String(), "fallback")
	f(TrustState(9).String(), "unknown")
	f(ReasonNone.String(), "")
	f(ReasonNoEventsYet.String(), "no_events_yet")
	f(ReasonGap.String(), "gap")
	f(ReasonReplaying.String(), "replaying")
	f(ReasonStale.String(), "stale")
	f(ReasonPublisherRestart.String(), "publisher_restart")
	f(ReasonCleared.String(), "cleared")
	f(ReasonMismatch.String(), "mismatch")
	f(ReasonEngineRestart.String(), "engine_restart")
	f(TrustReason(99).String(), "unknown")
	if rs := TrustReasons(); len(rs) != 8 || rs[0] != ReasonNoEventsYet || rs[7] != ReasonEngineRestart {
		t.Fatalf("TrustReasons() = %v", rs)
	}
	// One word, both halves intact at the extremes.
	for _, s := range []TrustState{TrustExact, TrustDegraded, TrustFallback} {
		for _, r := range append(TrustReasons(), ReasonNone) {
			if gs, gr := unpackTrust(trustWord(s, r)); gs != s || gr != r {
				t.Fatalf("trustWord(%s, %s) unpacks to %s, %s", s, r, gs, gr)
			}
		}
	}
}

func TestSubscriberConfigValidate(t *testing.T) {
	f := func(c SubscriberConfig, wantErrs int) {
		t.Helper()
		err := c.Validate()
		n := 0
		if err != nil {
			n = len(err.(interface{ Unwrap() []error }).Unwrap())
		}
		if n != wantErrs {
			t.Fatalf("%+v: got %d errors (%v); want %d", c, n, err, wantErrs)
		}
	}
	f(SubscriberConfig{Endpoint: "tcp://127.0.0.1:5557"}, 0)
	f(SubscriberConfig{Endpoint: "tcp://*:5557", Mode: "bind", ReplayEndpoint: "tcp://10.0.0.1:5558", StaleAfter: time.Second, MaxBlocks: 10}, 0)
	f(SubscriberConfig{Endpoint: "ipc:///tmp/kv", Mode: "connect"}, 0)
	f(SubscriberConfig{}, 1)
	f(SubscriberConfig{Endpoint: "http://x", ReplayEndpoint: "tcp://", Mode: "listen", StaleAfter: -1, MaxBlocks: -1}, 5)
	// Size limits: not negative, and the queue holds one message of the largest size.
	ep := "tcp://127.0.0.1:5557"
	f(SubscriberConfig{Endpoint: ep, MaxMessageBytes: -1, MaxQueueBytes: -1}, 2)
	f(SubscriberConfig{Endpoint: ep, MaxQueueBytes: 1 << 20}, 1) // the default message is 16 MiB
	f(SubscriberConfig{Endpoint: ep, MaxMessageBytes: 1 << 20, MaxQueueBytes: 1 << 20}, 1)
	f(SubscriberConfig{Endpoint: ep, MaxMessageBytes: 1 << 20, MaxQueueBytes: 1<<20 + queuedOverhead}, 0)
	f(SubscriberConfig{Endpoint: ep, MaxMessageBytes: DefaultMaxQueueBytes}, 1)
}

func TestStreamRealisticBatch(t *testing.T) {
	// The benchmark payload must exercise the real path: 24 chained blocks stored, the last one removed.
	h := newHarness(t, StreamConfig{})
	h.st.Handle(nil, 0, realisticBatch(false), h.now)
	h.st.Handle(nil, 1, realisticBatch(true), h.now)
	st := h.st.Stats()
	if !st.Trusted || st.Blocks != 23 || st.UnknownParents != 0 || st.RemovedBlocks != 2 || st.UnknownRemoves != 6 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamImplausibleJump(t *testing.T) {
	type counts struct{ jumps, gaps, lost, restarts, clears, last uint64 }
	f := func(name string, seqs []uint64, wantState TrustState, wantReason TrustReason, want counts, wantResident ...uint64) {
		t.Helper()
		h := newHarness(t, StreamConfig{})
		h.pub(seqs...)
		if s, r := h.st.Trust(); s != wantState || r != wantReason {
			t.Fatalf("%s: trust %s/%s; want %s/%s", name, s, r, wantState, wantReason)
		}
		s := h.st.Stats()
		if got := (counts{s.ImplausibleJumps, s.Gaps, s.LostBatches, s.Restarts, s.Clears, s.LastSeq}); got != want {
			t.Fatalf("%s: got %+v; want %+v", name, got, want)
		}
		h.wantResident(wantResident...)
	}
	const far = math.MaxUint64 - 4
	// One forged sequence: ignored, untrusted until the publisher's next batch shows it was not its own.
	f("forged, pending", []uint64{0, 1, 2, far}, TrustDegraded, ReasonGap, counts{jumps: 1, last: 2}, 0, 1, 2)
	f("forged, then the publisher", []uint64{0, 1, 2, far, 3}, TrustExact, ReasonNone, counts{jumps: 1, last: 3}, 0, 1, 2, 3)
	f("two forged apart", []uint64{0, 1, far, 2, far - 100, 3}, TrustExact, ReasonNone, counts{jumps: 2, last: 3}, 0, 1, 2, 3)
	// Two in a row: resynchronised to them (cleared, counted as a gap, not as lost batches); the real
	// publisher's next batch is then a restart.
	f("forged run", []uint64{0, 1, 2, far, far + 1}, TrustFallback, ReasonGap, counts{jumps: 2, gaps: 1, clears: 1, last: far + 1})
	f("forged run, then the publisher", []uint64{0, 1, 2, far, far + 1, 3, 4}, TrustExact, ReasonNone,
		counts{jumps: 2, gaps: 1, restarts: 1, clears: 2, last: 4}, 3, 4)
	// A publisher really 2^20+ batches ahead: the second batch settles it, the third is trusted.
	j := uint64(2 + maxSeqJump + 5)
	f("real far jump", []uint64{0, 1, 2, j, j + 1, j + 2}, TrustExact, ReasonNone, counts{jumps: 2, gaps: 1, clears: 1, last: j + 2})
	// The bound: a jump of maxSeqJump is still a gap, one more is implausible.
	f("largest gap", []uint64{0, 1, 1 + maxSeqJump}, TrustFallback, ReasonGap,
		counts{gaps: 1, lost: maxSeqJump - 1, clears: 1, last: 1 + maxSeqJump})
	f("smallest implausible jump", []uint64{0, 1, 2 + maxSeqJump}, TrustDegraded, ReasonGap, counts{jumps: 1, last: 1}, 0, 1)
	// At 2^64-1 the next sequence wraps to 0: that is a restart, not a contiguous batch.
	f("wrap", []uint64{math.MaxUint64, 0}, TrustExact, ReasonNone, counts{restarts: 1, clears: 1, last: 0}, 0)
}

func TestStreamDropped(t *testing.T) {
	f := func(name string, before []uint64, after []uint64, wantState TrustState, wantReason TrustReason, wantResident ...uint64) {
		t.Helper()
		h := newHarness(t, StreamConfig{})
		h.pub(before...)
		h.st.dropped()
		h.pub(after...)
		if s, r := h.st.Trust(); s != wantState || r != wantReason {
			t.Fatalf("%s: trust %s/%s; want %s/%s", name, s, r, wantState, wantReason)
		}
		h.wantResident(wantResident...)
	}
	// The target is untrusted at once: the next batch may never come.
	f("pending", []uint64{0, 1}, nil, TrustDegraded, ReasonGap, 0, 1)
	// The next batch shows what was lost: a gap (cleared without a replayer)...
	f("gap", []uint64{0, 1}, []uint64{4}, TrustFallback, ReasonGap, 4)
	// ...or nothing of this stream (the sequence goes on).
	f("nothing lost", []uint64{0, 1}, []uint64{2}, TrustExact, ReasonNone, 0, 1, 2)
	// Before the first batch there is nothing to distrust: the first batch is a late join.
	f("before the first batch", nil, nil, TrustFallback, ReasonNoEventsYet)
	f("late join", nil, []uint64{7}, TrustExact, ReasonNone, 7)
}
