package kvindex

import (
	"errors"
	"math"
	"slices"
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

func (h *streamHarness) wantTrust(trusted bool, r Reason) {
	h.t.Helper()
	if h.st.Trusted() != trusted || h.st.Reason() != r {
		h.t.Fatalf("trusted=%v reason=%s; want %v %s", h.st.Trusted(), h.st.Reason(), trusted, r)
	}
}

func TestStreamContiguousAndLateJoin(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.wantTrust(false, ReasonWaiting)
	h.pub(5) // a late joiner is not a gap
	h.wantTrust(true, ReasonNone)
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
	h.wantTrust(false, ReasonGap)
	// The index was cleared (batches 3 and 4 may hold removals) and applied batch 5.
	h.wantResident(5)
	h.pub(6)
	h.wantTrust(true, ReasonNone)
	h.wantResident(5, 6)
	if st := h.st.Stats(); st.Gaps != 1 || st.LostBatches != 2 || st.Clears != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamGapReplay(t *testing.T) {
	rp := newFakeReplayer(0, 1, 2, 3, 4, 5, 6)
	h := newHarness(t, StreamConfig{Replayer: rp})
	h.pub(0, 1, 4)
	h.wantTrust(true, ReasonNone)
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
		h.wantTrust(false, ReasonGap)
		h.wantResident(4)
		if st := h.st.Stats(); st.ReplaysFailed != 1 || st.ReplaysOK != 0 {
			t.Fatalf("unexpected stats %+v", st)
		}
		h.pub(5)
		h.wantTrust(true, ReasonNone)
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
	h.wantTrust(true, ReasonNone)
	h.wantResident(0)
	h.pub(1, 2, 3, 7, 8, 9, 4)
	// Back to 4 without replay: cleared, untrusted until the next contiguous batch.
	h.wantTrust(false, ReasonRestart)
	h.wantResident(4)
	h.pub(5)
	h.wantTrust(true, ReasonNone)
	// llm-d-inference-sim numbers from 1.
	h.pub(1)
	h.wantTrust(true, ReasonNone)
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
	h.wantTrust(true, ReasonNone)
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
		h.wantTrust(true, ReasonNone)
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
	h.wantTrust(true, ReasonNone)
	h.wantResident(5)
}

func TestStreamMalformed(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0, 1)
	h.st.Handle(nil, 2, []byte{0x93, 0x01}, h.now)
	h.wantTrust(false, ReasonMalformed)
	h.wantResident()
	h.pub(3)
	h.wantTrust(true, ReasonNone)
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
	h.wantTrust(true, ReasonNone)
	f(nil, be64(1), seqPayload(1))
	h.wantTrust(true, ReasonNone)
	h.wantResident(0, 1)
	if st := h.st.Stats(); st.GarbageFrames != 4 || st.Batches != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamStale(t *testing.T) {
	h := newHarness(t, StreamConfig{StaleAfter: 10 * time.Second})
	h.st.Tick(h.now.Add(time.Hour)) // nothing received yet: waiting, not stale
	h.wantTrust(false, ReasonWaiting)
	h.pub(0)
	h.st.Tick(h.now.Add(9 * time.Second))
	h.wantTrust(true, ReasonNone)
	h.st.Tick(h.now.Add(10 * time.Second))
	h.wantTrust(false, ReasonStale)
	h.st.Tick(h.now.Add(20 * time.Second))
	h.now = h.now.Add(30 * time.Second)
	h.pub(1)
	h.wantTrust(true, ReasonNone)
	h.wantResident(0, 1)
	if st := h.st.Stats(); st.StaleTransitions != 1 {
		t.Fatalf("unexpected stats %+v", st)
	}
	// Staleness ends with any message; a gap after it is still a gap.
	h.st.Tick(h.now.Add(time.Minute))
	h.now = h.now.Add(2 * time.Minute)
	h.pub(5)
	h.wantTrust(false, ReasonGap)
}

func TestStreamUnknownParent(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(0)
	orphan := batchOf(storedEvent([]uint64{77}, 76, []uint32{1, 2}, 2))
	h.st.Handle(nil, 1, orphan, h.now)
	h.wantTrust(false, ReasonUnknownParent)
	h.wantResident()
	h.pub(2)
	h.wantTrust(true, ReasonNone)
	// After the clear the engine may hold blocks the index never saw: orphans are expected now.
	h.st.Handle(nil, 3, orphan, h.now)
	h.wantTrust(true, ReasonNone)
	if st := h.st.Stats(); st.MissedEvents != 1 || st.UnknownParents != 2 {
		t.Fatalf("unexpected stats %+v", st)
	}
}

func TestStreamAllBlocksCleared(t *testing.T) {
	h := newHarness(t, StreamConfig{})
	h.pub(3, 4)
	h.st.Handle(nil, 5, batchOf(clearedEvent()), h.now)
	h.wantTrust(true, ReasonNone)
	h.wantResident()
	// After AllBlocksCleared the index knows the whole (empty) cache, so an orphan proves missed events.
	h.st.Handle(nil, 6, batchOf(storedEvent([]uint64{77}, 76, []uint32{1, 2}, 2)), h.now)
	h.wantTrust(false, ReasonUnknownParent)
}

func TestReasonString(t *testing.T) {
	f := func(r Reason, want string) {
		t.Helper()
		if r.String() != want {
			t.Fatalf("got %q; want %q", r.String(), want)
		}
	}
	f(ReasonNone, "none")
	f(ReasonWaiting, "waiting")
	f(ReasonGap, "gap")
	f(ReasonRestart, "restart")
	f(ReasonMalformed, "malformed")
	f(ReasonStale, "stale")
	f(ReasonUnknownParent, "unknown_parent")
	f(Reason(99), "unknown")
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
	f := func(name string, seqs []uint64, wantTrusted bool, wantReason Reason, want counts, wantResident ...uint64) {
		t.Helper()
		h := newHarness(t, StreamConfig{})
		h.pub(seqs...)
		if h.st.Trusted() != wantTrusted || h.st.Reason() != wantReason {
			t.Fatalf("%s: trusted=%v reason=%s; want %v %s", name, h.st.Trusted(), h.st.Reason(), wantTrusted, wantReason)
		}
		s := h.st.Stats()
		if got := (counts{s.ImplausibleJumps, s.Gaps, s.LostBatches, s.Restarts, s.Clears, s.LastSeq}); got != want {
			t.Fatalf("%s: got %+v; want %+v", name, got, want)
		}
		h.wantResident(wantResident...)
	}
	const far = math.MaxUint64 - 4
	// One forged sequence: ignored, untrusted until the publisher's next batch shows it was not its own.
	f("forged, pending", []uint64{0, 1, 2, far}, false, ReasonGap, counts{jumps: 1, last: 2}, 0, 1, 2)
	f("forged, then the publisher", []uint64{0, 1, 2, far, 3}, true, ReasonNone, counts{jumps: 1, last: 3}, 0, 1, 2, 3)
	f("two forged apart", []uint64{0, 1, far, 2, far - 100, 3}, true, ReasonNone, counts{jumps: 2, last: 3}, 0, 1, 2, 3)
	// Two in a row: resynchronised to them (cleared, counted as a gap, not as lost batches); the real
	// publisher's next batch is then a restart.
	f("forged run", []uint64{0, 1, 2, far, far + 1}, false, ReasonGap, counts{jumps: 2, gaps: 1, clears: 1, last: far + 1})
	f("forged run, then the publisher", []uint64{0, 1, 2, far, far + 1, 3, 4}, true, ReasonNone,
		counts{jumps: 2, gaps: 1, restarts: 1, clears: 2, last: 4}, 3, 4)
	// A publisher really 2^20+ batches ahead: the second batch settles it, the third is trusted.
	j := uint64(2 + maxSeqJump + 5)
	f("real far jump", []uint64{0, 1, 2, j, j + 1, j + 2}, true, ReasonNone, counts{jumps: 2, gaps: 1, clears: 1, last: j + 2})
	// The bound: a jump of maxSeqJump is still a gap, one more is implausible.
	f("largest gap", []uint64{0, 1, 1 + maxSeqJump}, false, ReasonGap,
		counts{gaps: 1, lost: maxSeqJump - 1, clears: 1, last: 1 + maxSeqJump})
	f("smallest implausible jump", []uint64{0, 1, 2 + maxSeqJump}, false, ReasonGap, counts{jumps: 1, last: 1}, 0, 1)
	// At 2^64-1 the next sequence wraps to 0: that is a restart, not a contiguous batch.
	f("wrap", []uint64{math.MaxUint64, 0}, true, ReasonNone, counts{restarts: 1, clears: 1, last: 0}, 0)
}

func TestStreamDropped(t *testing.T) {
	f := func(name string, before []uint64, after []uint64, wantTrusted bool, wantReason Reason, wantResident ...uint64) {
		t.Helper()
		h := newHarness(t, StreamConfig{})
		h.pub(before...)
		h.st.dropped()
		h.pub(after...)
		if h.st.Trusted() != wantTrusted || h.st.Reason() != wantReason {
			t.Fatalf("%s: trusted=%v reason=%s; want %v %s", name, h.st.Trusted(), h.st.Reason(), wantTrusted, wantReason)
		}
		h.wantResident(wantResident...)
	}
	// The target is untrusted at once: the next batch may never come.
	f("pending", []uint64{0, 1}, nil, false, ReasonGap, 0, 1)
	// The next batch shows what was lost: a gap (cleared without a replayer)...
	f("gap", []uint64{0, 1}, []uint64{4}, false, ReasonGap, 4)
	// ...or nothing of this stream (the sequence goes on).
	f("nothing lost", []uint64{0, 1}, []uint64{2}, true, ReasonNone, 0, 1, 2)
	// Before the first batch there is nothing to distrust: the first batch is a late join.
	f("before the first batch", nil, nil, false, ReasonWaiting)
	f("late join", nil, []uint64{7}, true, ReasonNone, 7)
}
