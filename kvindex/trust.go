package kvindex

// TrustState says how far a target's KV evidence can be believed (the transitions are in doc.go,
// "Trust"). Routing scores only TrustExact evidence; the other two differ for the operator: degraded is a
// recovery in progress or a doubt the next batch settles, fallback waits for the publisher.
type TrustState uint8

const (
	// TrustExact: the index holds what the engine's cache holds, as far as the events tell (after a clear it
	// can only under-report: blocks stored before it are unknown, never blocks gone).
	TrustExact TrustState = iota
	// TrustDegraded: events may be missing and recovery is under way (a replay runs, or the next batch
	// settles a doubt); the index is kept but not scored.
	TrustDegraded
	// TrustFallback: the index is not evidence: nothing received yet, silent for stale_secs, or cleared
	// after lost events with nothing to recover them; routing uses the target's other evidence.
	TrustFallback
)

var trustStateNames = [...]string{"exact", "degraded", "fallback"}

// String returns "exact", "degraded" or "fallback" (a metric label, a state API value).
func (s TrustState) String() string {
	if int(s) < len(trustStateNames) {
		return trustStateNames[s]
	}
	return "unknown"
}

// TrustReason says why a target's evidence is in its TrustState. The names are shared with the gateway's
// other evidence sources: ReasonEngineRestart is set by the gateway from its engine scraper,
// never by a Stream.
type TrustReason uint8

const (
	// ReasonNone: exact, nothing to add.
	ReasonNone TrustReason = iota
	// ReasonNoEventsYet: no batch has arrived since the subscription started (fallback).
	ReasonNoEventsYet
	// ReasonGap: batches were lost: a sequence gap, a batch the subscriber's queue dropped, or an
	// implausible sequence jump (degraded while the next batch or a replay may recover it, fallback after
	// the index was cleared).
	ReasonGap
	// ReasonReplaying: the publisher's buffered batches are being replayed into the index (degraded).
	ReasonReplaying
	// ReasonStale: no batch for stale_secs (fallback; nothing cleared).
	ReasonStale
	// ReasonPublisherRestart: the sequence went back; the index was cleared (fallback until the new run is
	// replayed or followed).
	ReasonPublisherRestart
	// ReasonCleared: the engine announced AllBlocksCleared and has stored nothing since: the index is empty
	// and exactly right (exact).
	ReasonCleared
	// ReasonMismatch: what arrived contradicts the index: a payload that does not decode (a wire format this
	// build does not read) or a stored block whose parent the index never saw (events missed without a
	// sequence gap). The index was cleared (fallback).
	ReasonMismatch
	// ReasonEngineRestart: the engine's process restarted (seen by the gateway's scraper, not by a Stream).
	ReasonEngineRestart
)

var trustReasonNames = [...]string{"", "no_events_yet", "gap", "replaying", "stale", "publisher_restart", "cleared", "mismatch",
	"engine_restart"}

// String returns the reason in snake_case ("gap", "publisher_restart", ...), "" for ReasonNone.
func (r TrustReason) String() string {
	if int(r) < len(trustReasonNames) {
		return trustReasonNames[r]
	}
	return "unknown"
}

// TrustReasons lists every reason but ReasonNone, in order: the label values of a per-reason metric.
func TrustReasons() []TrustReason {
	rs := make([]TrustReason, 0, len(trustReasonNames)-1)
	for r := ReasonNoEventsYet; int(r) < len(trustReasonNames); r++ {
		rs = append(rs, r)
	}
	return rs
}

// trustWord packs a state and a reason into the one atomic word a Stream publishes, so that a reader never
// sees the state of one transition with the reason of another.
func trustWord(s TrustState, r TrustReason) uint32 {
	return uint32(s) | uint32(r)<<8
}

func unpackTrust(w uint32) (TrustState, TrustReason) {
	return TrustState(w), TrustReason(w >> 8)
}
