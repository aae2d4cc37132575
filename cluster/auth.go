package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"time"
)

// With a shared key ([cluster] key_env) every message travels in an authenticated envelope, little-endian:
//
//	version      1 byte, authVersion
//	timestamp    8 bytes, the sender's clock in unix nanoseconds, strictly increasing per sender
//	mac          16 bytes, HMAC-SHA256(key, subject, version, timestamp, body) truncated to 128 bits
//	body         an evidence message without its version byte (replica id, records), or a load message's
//	             JSON
//
// The subject is in the MAC, so a message cannot be replayed onto another kind or another fleet's subject.
// A receiver refuses a message outside maxSkew of its own clock (stale), and one whose timestamp is not
// after the last it accepted from the same sender on the same subject (replayed). Without a key the
// messages are the bare ones (wire.go): a replica with a key refuses them, one without refuses envelopes.
const (
	authVersion = 2
	tsBytes     = 8
	macBytes    = 16
	authHeader  = 1 + tsBytes + macBytes
	// maxSkew is how far a message's timestamp may be from the receiver's clock: the replicas' clocks
	// must agree within it (NTP does by far).
	maxSkew = 10 * time.Second
)

// Why a message was refused (rolter_cluster_refused_total{reason}).
const (
	refuseUnauthenticated = iota // no MAC, and this replica has a key
	refuseBadMAC                 // a MAC that does not verify, or one this replica has no key for
	refuseStale                  // a timestamp outside maxSkew
	refuseReplayed               // a timestamp not after the sender's last
	refuseTooManyPeers           // a sender beyond max_peers
	refuseRateLimited            // evidence over the sender's peer_evidence_per_sec
	refuseInflightCapped         // an in-flight claim over the cap (the claim is cut to the cap)
	numRefusals
)

var refusalNames = [numRefusals]string{"unauthenticated", "bad_mac", "stale", "replayed", "too_many_peers",
	"rate_limited", "inflight_capped"}

// refusedError is a message refused for one of the reasons above; one value per reason, so that refusing
// does not allocate.
type refusedError struct{ reason int }

func (e *refusedError) Error() string { return "cannot accept message: " + refusalNames[e.reason] }

var refusals = func() (r [numRefusals]*refusedError) {
	for i := range r {
		r[i] = &refusedError{i}
	}
	return r
}()

// refusalOf returns the reason of a refusal, or -1 for any other error. Refusals are never wrapped, and a
// type assertion does not allocate where errors.As would.
func refusalOf(err error) int {
	if r, ok := err.(*refusedError); ok {
		return r.reason
	}
	return -1
}

// signer computes the MACs of one goroutine: a hash.Hash is not safe for concurrent use, so the publisher
// and each subscription's handler have their own. It does not allocate once made.
type signer struct {
	h        hash.Hash
	subjects [numKinds][]byte
	sum      [sha256.Size]byte
}

func newSigner(key []byte, subjects [numKinds]string) *signer {
	s := &signer{h: hmac.New(sha256.New, key)}
	for k, subj := range subjects {
		s.subjects[k] = []byte(subj)
	}
	return s
}

// mac returns the MAC of the envelope msg (at least authHeader bytes) on kind's subject; it aliases the
// signer until the next call.
func (s *signer) mac(kind int, msg []byte) []byte {
	s.h.Reset()
	s.h.Write(s.subjects[kind])
	s.h.Write(msg[:1+tsBytes])
	s.h.Write(msg[authHeader:])
	return s.h.Sum(s.sum[:0])[:macBytes]
}

// seal stamps the envelope msg with ts and its MAC.
func (s *signer) seal(kind int, msg []byte, ts int64) {
	msg[0] = authVersion
	binary.LittleEndian.PutUint64(msg[1:], uint64(ts))
	copy(msg[1+tsBytes:authHeader], s.mac(kind, msg))
}

// open checks the envelope msg on kind's subject at now and returns its timestamp and body (aliasing msg).
// The replay check is the caller's: it needs the sender, which is in the body.
func (s *signer) open(kind int, msg []byte, now time.Time) (ts int64, body []byte, err error) {
	if len(msg) < authHeader || msg[0] != authVersion {
		return 0, nil, refusals[refuseUnauthenticated]
	}
	if !hmac.Equal(s.mac(kind, msg), msg[1+tsBytes:authHeader]) {
		return 0, nil, refusals[refuseBadMAC]
	}
	ts = int64(binary.LittleEndian.Uint64(msg[1:]))
	if d := time.Duration(now.UnixNano() - ts); d > maxSkew || d < -maxSkew {
		return 0, nil, refusals[refuseStale]
	}
	return ts, msg[authHeader:], nil
}

// bucket is a token bucket: rate tokens a second, holding at most a second's worth.
type bucket struct {
	tokens float64
	at     time.Time
}

// take removes n tokens at now if there are that many.
func (b *bucket) take(n int, rate float64, now time.Time) bool {
	if b.at.IsZero() {
		b.tokens = rate
	} else if d := now.Sub(b.at).Seconds(); d > 0 {
		b.tokens = min(b.tokens+d*rate, rate)
	}
	b.at = now
	if b.tokens < float64(n) {
		return false
	}
	b.tokens -= float64(n)
	return true
}

// evidencePeers is what the evidence handler, its one user, keeps of each sender: the last timestamp it
// accepted and its rate bucket. At most max peers; a sender not heard from for maxAge makes room.
type evidencePeers struct {
	max    int
	maxAge time.Duration
	rate   float64
	peers  map[uint64]*evidencePeer
}

type evidencePeer struct {
	lastTS int64
	heard  time.Time
	bucket bucket
}

func newEvidencePeers(max int, maxAge time.Duration, rate float64) *evidencePeers {
	return &evidencePeers{max: max, maxAge: maxAge, rate: rate, peers: map[uint64]*evidencePeer{}}
}

// admit returns the state of sender id at now, or nil when there are max peers already and none is quiet.
func (e *evidencePeers) admit(id uint64, now time.Time) *evidencePeer {
	p := e.peers[id]
	if p == nil {
		if len(e.peers) >= e.max {
			for id, q := range e.peers {
				if now.Sub(q.heard) > e.maxAge {
					delete(e.peers, id)
				}
			}
		}
		if len(e.peers) >= e.max {
			return nil
		}
		p = &evidencePeer{}
		e.peers[id] = p
	}
	p.heard = now
	return p
}

// countRecords is the records of recs, which parseEvidence accepted.
func countRecords(recs []byte) int {
	n := 0
	for r := (recordReader{recs}); ; n++ {
		if _, _, ok := r.next(); !ok {
			return n
		}
	}
}
