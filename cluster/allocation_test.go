//go:build !race

package cluster

import (
	"testing"
	"time"
)

// The request path's contract: Held and Routed allocate nothing, with room in the queue or none; nor does
// applying a received message.
func TestHeldAllocs(t *testing.T) {
	c := newTestCluster(testConfig())
	cps := chain(1, 64)
	if err := c.applyEvidence(appendRecord(appendHeader(nil, 2), 3, cps[:40])); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(1000, func() {
		if c.Held(3, cps) != 40 || c.Held(4, cps) != 0 {
			t.Fatal("wrong Held")
		}
	})
	if n != 0 {
		t.Fatalf("Held allocates %v times per call; want 0", n)
	}
}

func TestRoutedAllocs(t *testing.T) {
	cfg := testConfig()
	for _, queue := range []int{4096, 1} { // room in the queue, and a full queue that drops
		cfg.QueueSize = queue
		c := newTestCluster(cfg)
		cps := chain(1, maxCheckpoints)
		n := testing.AllocsPerRun(1000, func() { c.Routed(5, cps) })
		if n != 0 {
			t.Fatalf("queue %d: Routed allocates %v times per call; want 0", queue, n)
		}
	}
}

func TestApplyEvidenceAllocs(t *testing.T) {
	c := newTestCluster(testConfig())
	msg := appendHeader(nil, 2)
	for i := 0; len(msg) < batchBytes; i++ {
		msg = appendRecord(msg, uint64(i%8), chain(uint64(i), 32))
	}
	bad := msg[:len(msg)-3]
	n := testing.AllocsPerRun(100, func() {
		if c.applyEvidence(msg) != nil || c.applyEvidence(bad) == nil {
			t.Fatal("wrong verdict")
		}
	})
	if n != 0 {
		t.Fatalf("applyEvidence allocates %v times per message; want 0", n)
	}
}

// Verifying an envelope (the MAC, the timestamp, the sender's bounds) allocates nothing either, nor does
// refusing a forged one.
func TestApplySealedEvidenceAllocs(t *testing.T) {
	c := newKeyedCluster(testConfig(), 1, testKey)
	sender := newKeyedCluster(testConfig(), 2, testKey)
	msg := sender.appendBatchHeader(nil)
	for i := 0; len(msg) < batchBytes; i++ {
		msg = appendRecord(msg, uint64(i%8), chain(uint64(i), 32))
	}
	ts := time.Now().UnixNano()
	sender.signers[signPublisher].seal(kindEvidence, msg, ts)
	forged := append([]byte(nil), msg...)
	forged[authHeader-1] ^= 1
	n := testing.AllocsPerRun(100, func() {
		ts++
		sender.signers[signPublisher].seal(kindEvidence, msg, ts)
		if err, ferr := c.applyEvidence(msg), c.applyEvidence(forged); err != nil || refusalOf(ferr) != refuseBadMAC {
			t.Fatalf("wrong verdict: %v, forged %v", err, ferr)
		}
	})
	if n != 0 {
		t.Fatalf("applyEvidence of an envelope allocates %v times per message; want 0", n)
	}
}
