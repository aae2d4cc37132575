package telemetry

// Trust of a target's KV-event stream (kvindex.Stream.Trust), per target = provider name, beside
// the rolter_kv_* families of metrics.go. The route-level rolter_evidence_trust{route,target,source} is the
// gateway's, not these.
const (
	// KVTrust is a gauge per target: 0 exact, 1 degraded, 2 fallback (kvindex.TrustState).
	KVTrust = "rolter_kv_stream_trust" // {target}
	// KVTrustReason is a state set per target: 1 for the reason the stream is in its state now, 0 for the
	// others (no_events_yet, gap, replaying, stale, publisher_restart, cleared, mismatch: the reasons a
	// stream sets); all 0 while exact with nothing to add.
	KVTrustReason = "rolter_kv_stream_trust_reason" // {target,reason}
	// EvidenceTrust is a gauge per route, target and evidence source ("trie", "kv_events"): 0 exact,
	// 1 degraded, 2 fallback.
	EvidenceTrust = "rolter_evidence_trust" // {route,target,source}
)
