package kvindex

import (
	"encoding/binary"
	"sync/atomic"
	"time"
)

// Replayer fetches buffered batches from the publisher's replay (ROUTER) socket.
type Replayer interface {
	// Replay requests every buffered batch with sequence >= start and calls fn for each, in the order
	// received, until the publisher's end marker. payload is valid only during fn. It returns an error when
	// the request fails or times out; batches already passed to fn stay passed.
	Replay(start uint64, fn func(seq uint64, payload []byte)) error
}

// StreamConfig configures a Stream.
type StreamConfig struct {
	// StaleAfter makes the target fallback/stale when no message arrived for this long; 0 disables it.
	StaleAfter time.Duration
	// Replayer, when set, is asked to fill sequence gaps (and, on a late join or a restart, the batches
	// before the first one seen).
	Replayer Replayer
}

// StreamStats is a snapshot of a Stream's counters plus its target's index counters.
type StreamStats struct {
	TargetStats

	// Batches counts payloads handed to the decoder (live and replayed).
	Batches uint64
	// Gaps counts forward sequence jumps; LostBatches sums the skipped sequence numbers.
	Gaps, LostBatches uint64
	// Restarts counts sequences going back (publisher restart).
	Restarts uint64
	// ReplaysOK and ReplaysFailed count replay attempts by outcome.
	ReplaysOK, ReplaysFailed uint64
	// DecodeErrors counts payloads that failed to decode (malformed).
	DecodeErrors uint64
	// GarbageFrames counts messages without the [topic, 8-byte seq, payload] shape, ignored.
	GarbageFrames uint64
	// StaleTransitions counts transitions into the stale state.
	StaleTransitions uint64
	// SkippedEvents counts events of unknown type.
	SkippedEvents uint64
	// MissedEvents counts unknown-parent incidents that proved missed events.
	MissedEvents uint64
	// ImplausibleJumps counts messages whose sequence jumped more than maxSeqJump (2^20) batches ahead: not
	// real gaps but forged or corrupt sequence numbers, or a publisher seen again after hours. They are
	// not added to LostBatches; see Stream.Handle.
	ImplausibleJumps uint64
	// QueueDrops counts batches the subscriber dropped because its queue to the index was full
	// (SubscriberConfig.MaxQueueBytes or 100,000 messages); each drop is handled as a gap.
	QueueDrops uint64
	// Disconnects counts publisher connections that libzmq closed: the publisher went away, heartbeats
	// timed out, or it sent a frame over SubscriberConfig.MaxMessageBytes (libzmq does not tell which).
	// For a target with a publisher policy, only connections that completed the handshake (see
	// AuthRefused). On a bind endpoint shared by several targets these are the socket's: which target a
	// connection carried is unknown, so each of them shows every one.
	Disconnects uint64
	// AuthRefused counts publisher connections refused by a bind-mode target's publisher policy
	// (SubscriberConfig.AllowedPublishers, CURVE), each before its first message: every handshake that
	// failed, whether the ZAP handler refused the address or the client key, the CURVE handshake failed
	// before asking it (a NULL publisher where CURVE is required, a publisher with the wrong server key),
	// or the connection broke during the handshake (a NULL publisher that noticed the mismatch first, a
	// port scan). With a policy, Disconnects leaves these out. A libzmq 4.3 publisher does not reconnect
	// after a refusal (it is counted once and stays away until its socket is reopened), except after a
	// wrong server key, which it retries every 100 ms or so, counted each time. A peer that does not speak
	// ZMTP 3 never reaches the policy: it shows only in Disconnects. Always 0 without a policy. The
	// socket's, on a shared bind endpoint (as Disconnects).
	AuthRefused uint64

	// LastSeq is the last sequence number accepted, when HasSeq.
	LastSeq uint64
	HasSeq  bool
	// Trust and Reason are the stream's trust (Stream.Trust), read together; Trusted is Trust ==
	// TrustExact.
	Trust   TrustState
	Reason  TrustReason
	Trusted bool
}

type streamCounters struct {
	batches, gaps, lostBatches, restarts       atomic.Uint64
	replaysOK, replaysFailed, decodeErrors     atomic.Uint64
	garbageFrames, staleTransitions, skipped   atomic.Uint64
	missedEvents, implausibleJumps, queueDrops atomic.Uint64
	disconnects, authRefused                   atomic.Uint64
}

// maxSeqJump is the largest forward sequence jump taken for a real gap: 2^20 batches is three hours of a
// publisher sending 100 batches a second, a hundred times vLLM's replay buffer (10,000 batches), so a
// real jump that large cannot be replayed either and is handled the same way (the target is cleared);
// beyond it the jump says nothing about lost batches. A single forged message with a sequence near 2^64
// made LostBatches 1.8e19.
const maxSeqJump = 1 << 20

// Stream is the per-target state machine between the ZMQ frames and the TargetIndex: it checks sequence
// numbers, decodes payloads, applies them and decides how far the target's evidence can be trusted.
//
// Trust (doc.go, "Trust", has the whole table): the stream starts fallback/no_events_yet. The first
// sequence seen is wherever the publisher is (a late joiner is not a gap). A forward jump is a gap:
// degraded/gap, then degraded/replaying while a Replayer fills it (exact when it did), else the target is
// cleared (fallback/gap). A sequence going back is a publisher restart: cleared, fallback/publisher_restart,
// then exact at once if the new sequence is the publisher's first, else after a replay from 0. A payload
// that does not decode or a parent the index never saw is a mismatch: cleared, fallback/mismatch. No
// message for StaleAfter is fallback/stale. A jump beyond maxSeqJump and a batch dropped by the
// subscriber's queue are degraded/gap until the next batch settles them (see Handle and dropped). After a
// clear the target is exact again at the next contiguous batch, because from then on the index is a
// consistent (if incomplete: it under-reports blocks stored before the clear) view. AllBlocksCleared
// leaves it exact/cleared until the engine stores a block again.
//
// Handle, HandleFrames and Tick must be called from one goroutine (the subscriber's applier); Trust,
// Trusted and Stats are safe for concurrent use and cheap enough for the request path. The subscriber's
// reader goroutine adds to the counters it owns (garbage frames, queue drops, disconnects, refused
// publishers).
type Stream struct {
	ti       *TargetIndex
	dec      Decoder
	replayer Replayer
	stale    time.Duration

	started bool
	lastSeq uint64
	lastMsg time.Time
	isStale bool
	// jumped: the last message was an implausible jump to jumpSeq, ignored until a second one confirms it.
	jumped  bool
	jumpSeq uint64

	// trust is trustWord(state, reason): one word, so that Trust never pairs one transition's state with
	// another's reason.
	trust  atomic.Uint32
	seq    atomic.Uint64
	hasSeq atomic.Bool
	c      streamCounters

	// observe, when set (tests, before the stream's goroutine starts), sees every trust transition, from
	// the writer goroutine: the transient ones (a replay of a few milliseconds) included.
	observe func(TrustState, TrustReason)
}

// NewStream returns a Stream applying events to ti. It starts fallback/no_events_yet.
func NewStream(ti *TargetIndex, cfg StreamConfig) *Stream {
	st := &Stream{ti: ti, replayer: cfg.Replayer, stale: cfg.StaleAfter}
	st.trust.Store(trustWord(TrustFallback, ReasonNoEventsYet))
	return st
}

// Target returns the index writer the stream owns.
func (st *Stream) Target() *TargetIndex {
	return st.ti
}

// Trust returns the target's trust state and why. It is one atomic load, safe for concurrent use and
// meant for the request path (once per request and target).
func (st *Stream) Trust() (TrustState, TrustReason) {
	return unpackTrust(st.trust.Load())
}

// Reason returns the reason half of Trust.
func (st *Stream) Reason() TrustReason {
	_, r := st.Trust()
	return r
}

// Trusted reports whether the target's evidence is exact (Trust returns TrustExact): the index reflects
// every event of its publisher since the last reset.
func (st *Stream) Trusted() bool {
	s, _ := st.Trust()
	return s == TrustExact
}

// Stats returns a snapshot of the stream's counters. It is safe for concurrent use.
func (st *Stream) Stats() StreamStats {
	c := &st.c
	trust, reason := st.Trust()
	return StreamStats{
		TargetStats:      st.ti.Stats(),
		Batches:          c.batches.Load(),
		Gaps:             c.gaps.Load(),
		LostBatches:      c.lostBatches.Load(),
		Restarts:         c.restarts.Load(),
		ReplaysOK:        c.replaysOK.Load(),
		ReplaysFailed:    c.replaysFailed.Load(),
		DecodeErrors:     c.decodeErrors.Load(),
		GarbageFrames:    c.garbageFrames.Load(),
		StaleTransitions: c.staleTransitions.Load(),
		SkippedEvents:    c.skipped.Load(),
		MissedEvents:     c.missedEvents.Load(),
		ImplausibleJumps: c.implausibleJumps.Load(),
		QueueDrops:       c.queueDrops.Load(),
		Disconnects:      c.disconnects.Load(),
		AuthRefused:      c.authRefused.Load(),
		LastSeq:          st.seq.Load(),
		HasSeq:           st.hasSeq.Load(),
		Trust:            trust,
		Reason:           reason,
		Trusted:          trust == TrustExact,
	}
}

// HandleFrames handles one ZMQ message. Anything but [topic, 8-byte big-endian seq, payload] is counted as
// a garbage frame and ignored: without a trustworthy sequence it cannot be placed in the stream.
func (st *Stream) HandleFrames(frames [][]byte, now time.Time) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		st.garbage()
		return
	}
	st.Handle(frames[0], binary.BigEndian.Uint64(frames[1]), frames[2], now)
}

// Handle handles one published batch. topic is not interpreted (the subscriber routed the message by it).
//
// A sequence more than maxSeqJump ahead of the last one is implausible: it is counted (ImplausibleJumps)
// and, being the only evidence, ignored, with the target degraded/gap until the next message settles it.
// When the publisher goes on from the last sequence, the implausible message was not part of the stream
// (forged or corrupt) and the index, untouched, is exact again. When the next message follows the
// implausible one, the publisher really is there: the target is cleared as for an unreplayable gap
// (fallback/gap, counted in Gaps but not in LostBatches) and exact from the message after. So one forged
// sequence costs one batch interval of trust and leaves every counter but ImplausibleJumps as it was; two
// in a row make the real publisher's next batch look like a restart, which clears the target and recovers
// as one (TestSubscriberForgedSequence).
func (st *Stream) Handle(topic []byte, seq uint64, payload []byte, now time.Time) {
	_ = topic
	if st.started && seq > st.lastSeq && seq-st.lastSeq > maxSeqJump {
		st.c.implausibleJumps.Add(1)
		if !st.jumped || seq-1 != st.jumpSeq {
			st.jumped, st.jumpSeq = true, seq
			st.set(TrustDegraded, ReasonGap)
			return
		}
		st.jumped = false
		st.lastMsg, st.isStale = now, false
		st.c.gaps.Add(1)
		st.set(TrustFallback, ReasonGap)
		st.ti.Clear()
		st.accept(seq, payload, false)
		return
	}
	st.jumped = false
	st.lastMsg = now
	st.isStale = false
	switch {
	case !st.started:
		st.started = true
		if seq <= 1 {
			// The publisher's first batch (vLLM numbers from 0, llm-d-inference-sim from 1): the index will
			// see the engine's whole cache.
			st.ti.MarkSynced()
		} else if st.replayer != nil {
			// A late joiner is not a gap, but what the publisher still buffers makes the index fuller.
			st.set(TrustDegraded, ReasonReplaying)
			if ok, dirty := st.catchUp(0, seq); !ok && dirty {
				st.ti.Clear()
			}
		}
		st.accept(seq, payload, true)
	case seq > st.lastSeq && seq-st.lastSeq == 1:
		// Written without lastSeq+1, which wraps when a forged sequence left lastSeq at 2^64-1.
		st.accept(seq, payload, true)
	case seq > st.lastSeq:
		st.c.gaps.Add(1)
		st.c.lostBatches.Add(seq - st.lastSeq - 1)
		st.set(TrustDegraded, ReasonGap)
		if st.replayer != nil {
			st.set(TrustDegraded, ReasonReplaying)
			if ok, _ := st.catchUp(st.lastSeq+1, seq); ok {
				st.accept(seq, payload, true)
				return
			}
		}
		// The lost batches may hold removals: what the index holds is no longer evidence.
		st.set(TrustFallback, ReasonGap)
		st.ti.Clear()
		st.accept(seq, payload, false)
	default:
		st.c.restarts.Add(1)
		st.set(TrustFallback, ReasonPublisherRestart)
		st.ti.Clear()
		trust := false
		if seq <= 1 {
			st.ti.MarkSynced()
			trust = true
		} else if st.replayer != nil {
			st.set(TrustDegraded, ReasonReplaying)
			ok, dirty := st.catchUp(0, seq)
			if !ok {
				st.set(TrustFallback, ReasonPublisherRestart)
				if dirty {
					st.ti.Clear()
				}
			}
			trust = ok
		}
		st.accept(seq, payload, trust)
	}
}

// Tick marks the target fallback/stale when no message arrived for StaleAfter. Call it periodically.
func (st *Stream) Tick(now time.Time) {
	if st.stale <= 0 || !st.started || st.isStale || now.Sub(st.lastMsg) < st.stale {
		return
	}
	st.isStale = true
	st.c.staleTransitions.Add(1)
	st.set(TrustFallback, ReasonStale)
}

// dropped records that the subscriber dropped batches at this point of the stream (its queue was full;
// the reader counted them in QueueDrops). Like a sequence gap, the target is degraded/gap at once, not at
// the next message, which may never come; that message then decides: a jump is handled as a gap (replayed
// or cleared), while a sequence that goes on from the last one proves that nothing of this stream was
// lost.
func (st *Stream) dropped() {
	if !st.started {
		// Nothing applied yet: the first message handled is wherever the publisher is (a late join).
		return
	}
	st.set(TrustDegraded, ReasonGap)
}

// garbage counts a message without the [topic, seq, payload] shape. Safe from any goroutine.
func (st *Stream) garbage() {
	st.c.garbageFrames.Add(1)
}

// fail resets the stream after a bug surfaced as a panic in its goroutine: the index state is unknown, so
// clear it (guarded: the clear may hit the same bug) and start over as a fresh subscriber
// (fallback/mismatch until the next batch, a late join).
func (st *Stream) fail() {
	st.set(TrustFallback, ReasonMismatch)
	st.started = false
	defer func() { _ = recover() }()
	st.ti.Clear()
}

func (st *Stream) setSeq(seq uint64) {
	st.lastSeq = seq
	st.seq.Store(seq)
	st.hasSeq.Store(true)
}

// set publishes a trust transition. Writer goroutine only.
func (st *Stream) set(s TrustState, r TrustReason) {
	w := trustWord(s, r)
	if st.trust.Swap(w) != w && st.observe != nil {
		st.observe(s, r)
	}
}

// accept applies batch seq. trust says whether the index is consistent once it is applied; when not, the
// target keeps its state until the next contiguous batch, unless the batch itself held AllBlocksCleared:
// from that event on the index has seen everything the engine's (empty) cache went through.
func (st *Stream) accept(seq uint64, payload []byte, trust bool) {
	applied := st.apply(payload)
	// Published once the batch is in the index: whoever reads LastSeq finds its blocks.
	st.setSeq(seq)
	if !applied {
		st.ti.Clear()
		st.set(TrustFallback, ReasonMismatch)
		return
	}
	if st.ti.takeClearedEvent() {
		trust = true
	}
	if !trust {
		return
	}
	if st.ti.emptySinceCleared() {
		st.set(TrustExact, ReasonCleared)
		return
	}
	st.set(TrustExact, ReasonNone)
}

// apply decodes and applies one payload. It returns false when the payload did not decode (it applies
// nothing then: Decode validates the whole batch first) or an unknown parent proved missed events; the
// caller clears the target.
func (st *Stream) apply(payload []byte) bool {
	st.c.batches.Add(1)
	bt, err := st.dec.Decode(payload, st.ti)
	if err != nil {
		st.c.decodeErrors.Add(1)
		return false
	}
	if bt.Skipped > 0 {
		st.c.skipped.Add(uint64(bt.Skipped))
	}
	if st.ti.takeMissed() {
		st.c.missedEvents.Add(1)
		return false
	}
	return true
}

// catchUp replays batches from..until-1 and applies them in order; batches at or after until are left to
// the live stream. ok reports whether every batch of the range was applied; dirty reports that some were,
// so a caller recovering from a failure must clear the target (the batches it could not apply may hold
// removals).
func (st *Stream) catchUp(from, until uint64) (ok, dirty bool) {
	next := from
	failed := false
	err := st.replayer.Replay(from, func(seq uint64, payload []byte) {
		if failed || seq >= until || seq < next {
			return
		}
		if seq != next {
			// llm-d-inference-sim numbers from 1, so a replay from 0 may legitimately start there.
			if !(from == 0 && !dirty && seq == 1) {
				failed = true
				return
			}
		}
		if from == 0 && !dirty && seq <= 1 {
			st.ti.MarkSynced()
		}
		dirty = true
		if !st.apply(payload) {
			failed = true
			return
		}
		next = seq + 1
		st.setSeq(seq)
	})
	if err == nil && !failed && next == until {
		st.c.replaysOK.Add(1)
		return true, dirty
	}
	st.c.replaysFailed.Add(1)
	return false, dirty
}
