package cluster

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// An evidence message, on <subject>.evidence, little-endian:
//
//	version      1 byte, evidenceVersion
//	replica id   8 bytes, the sender's
//	records      one or more of:
//	  engine     8 bytes, engine.PeerID of the target the request went to
//	  count      1 byte, 1..maxCheckpoints
//	  cps        count x 8 bytes, the request's checkpoints from the first
//
// A sender keeps a message under batchBytes plus one record; a receiver takes up to maxEvidenceBytes (the
// NATS server's default max_payload) and drops anything else whole: another version, a record cut short,
// a count of 0 or over maxCheckpoints, no record at all.
const (
	evidenceVersion = 1
	headerBytes     = 1 + 8
	// maxCheckpoints is engine's maxPeerCheckpoints: a request's key has at most this many checkpoints.
	maxCheckpoints   = 96
	maxRecordBytes   = 8 + 1 + 8*maxCheckpoints
	batchBytes       = 32 << 10
	maxEvidenceBytes = 1 << 20
)

// Why an evidence message was refused; package-level so that refusing one does not allocate.
var (
	errVersion   = errors.New("cannot decode evidence: unknown version")
	errSize      = errors.New("cannot decode evidence: message too short or too long")
	errTruncated = errors.New("cannot decode evidence: record cut short")
	errCount     = errors.New("cannot decode evidence: checkpoint count out of range")
)

// recordBytes is the encoded size of a record of n checkpoints.
func recordBytes(n int) int { return 8 + 1 + 8*n }

// appendHeader appends an evidence message's header to b.
func appendHeader(b []byte, from uint64) []byte {
	b = append(b, evidenceVersion)
	return binary.LittleEndian.AppendUint64(b, from)
}

// appendRecord appends one record to b; cps must hold 1..maxCheckpoints checkpoints.
func appendRecord(b []byte, engine uint64, cps []uint64) []byte {
	b = binary.LittleEndian.AppendUint64(b, engine)
	b = append(b, byte(len(cps)))
	for _, cp := range cps {
		b = binary.LittleEndian.AppendUint64(b, cp)
	}
	return b
}

// parseEvidence checks a whole bare evidence message and returns its sender and its records, for a
// recordReader. It reads msg once and does not allocate; recs aliases msg.
func parseEvidence(msg []byte) (from uint64, recs []byte, err error) {
	if len(msg) < headerBytes+recordBytes(1) || len(msg) > maxEvidenceBytes {
		return 0, nil, errSize
	}
	if msg[0] != evidenceVersion {
		return 0, nil, errVersion
	}
	return parseEvidenceBody(msg[1:])
}

// parseEvidenceBody checks an evidence message's body, what follows its version byte (bare) or its
// envelope (auth.go): the sender's replica id and the records.
func parseEvidenceBody(body []byte) (from uint64, recs []byte, err error) {
	if len(body) < 8+recordBytes(1) || len(body) > maxEvidenceBytes {
		return 0, nil, errSize
	}
	from, recs = binary.LittleEndian.Uint64(body), body[8:]
	for b := recs; len(b) > 0; {
		if len(b) < 9 {
			return 0, nil, errTruncated
		}
		n := int(b[8])
		if n == 0 || n > maxCheckpoints {
			return 0, nil, errCount
		}
		if len(b) < recordBytes(n) {
			return 0, nil, errTruncated
		}
		b = b[recordBytes(n):]
	}
	return from, recs, nil
}

// recordReader walks the records parseEvidence accepted.
type recordReader struct{ b []byte }

// next returns the next record: its engine and its checkpoints as count x 8 little-endian bytes (aliasing
// the message). False at the end.
func (r *recordReader) next() (engine uint64, cps []byte, ok bool) {
	if len(r.b) < 9 {
		return 0, nil, false
	}
	n := recordBytes(int(r.b[8]))
	if n > len(r.b) {
		return 0, nil, false // parseEvidence refuses this; never trust a caller to have called it
	}
	engine, cps, r.b = binary.LittleEndian.Uint64(r.b), r.b[9:n], r.b[n:]
	return engine, cps, true
}

// A load message, on <subject>.load, is JSON: the sender's replica id and its in-flight requests per
// provider name, e.g. {"id":"9f86d081884c7d65","inflight":{"vllm-0":3,"vllm-1":0}}. Every interval, so it
// is also the heartbeat that keeps the sender a live peer.
type loadMessage struct {
	ID       string           `json:"id"`
	Inflight map[string]int64 `json:"inflight"`
}

// Bounds of a load message: a replica with more providers sends the first maxProviders.
const (
	maxLoadBytes = 64 << 10
	maxProviders = 256
	maxNameBytes = 256
	maxIDBytes   = 64
	maxInflight  = 1 << 24
)

// decodeLoad parses and checks a load message.
func decodeLoad(msg []byte) (loadMessage, error) {
	var m loadMessage
	if len(msg) > maxLoadBytes {
		return m, fmt.Errorf("cannot decode load: %d bytes, over %d", len(msg), maxLoadBytes)
	}
	if err := json.Unmarshal(msg, &m); err != nil {
		return m, fmt.Errorf("cannot decode load: %w", err)
	}
	if m.ID == "" || len(m.ID) > maxIDBytes || !utf8.ValidString(m.ID) {
		return m, fmt.Errorf("cannot decode load: bad id %q", m.ID)
	}
	if len(m.Inflight) > maxProviders {
		return m, fmt.Errorf("cannot decode load: %d providers, over %d", len(m.Inflight), maxProviders)
	}
	for name, n := range m.Inflight {
		if name == "" || len(name) > maxNameBytes {
			return m, fmt.Errorf("cannot decode load: bad provider name %q", name)
		}
		if n < 0 || n > maxInflight {
			return m, fmt.Errorf("cannot decode load: in-flight %d for %q out of range", n, name)
		}
	}
	return m, nil
}
