package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

var testKey = []byte(strings.Repeat("k", config.MinClusterKeyBytes))

// newKeyedCluster is a Cluster without NATS that holds key.
func newKeyedCluster(cfg config.ClusterConfig, id uint64, key []byte) *Cluster {
	c := newCluster(cfg, nopGateway{}, id, key)
	c.log = quietLog
	return c
}

// sealedEvidence is what a replica with key and id publishes for one record, stamped ts.
func sealedEvidence(key []byte, id uint64, ts int64, engine uint64, cps []uint64) []byte {
	c := newKeyedCluster(testConfig(), id, key)
	msg := appendRecord(c.appendBatchHeader(nil), engine, cps)
	c.signers[signPublisher].seal(kindEvidence, msg, ts)
	return msg
}

func TestEnvelope(t *testing.T) {
	cps := chain(1, 8)
	now := time.Now().UnixNano()
	f := func(name string, receiverKey, msg []byte, want int) {
		t.Helper()
		c := newKeyedCluster(testConfig(), 1, receiverKey)
		err := c.applyEvidence(msg)
		got := refusalOf(err)
		if err == nil {
			got = -2
		}
		if got != want {
			t.Fatalf("%s: %v; want reason %d", name, err, want)
		}
		if held := c.Held(5, cps); (want == -2) != (held == len(cps)) {
			t.Fatalf("%s: Held %d", name, held)
		}
	}
	f("valid", testKey, sealedEvidence(testKey, 2, now, 5, cps), -2)
	f("bare message to a keyed replica", testKey, appendRecord(appendHeader(nil, 2), 5, cps), refuseUnauthenticated)
	f("another key", testKey, sealedEvidence([]byte(strings.Repeat("x", 32)), 2, now, 5, cps), refuseBadMAC)
	f("no key to check it", nil, sealedEvidence(testKey, 2, now, 5, cps), refuseBadMAC)
	f("stale", testKey, sealedEvidence(testKey, 2, now-int64(maxSkew)-int64(time.Second), 5, cps), refuseStale)
	f("from the future", testKey, sealedEvidence(testKey, 2, now+int64(maxSkew)+int64(time.Second), 5, cps), refuseStale)
	tampered := sealedEvidence(testKey, 2, now, 5, cps)
	tampered[len(tampered)-1] ^= 1
	f("tampered body", testKey, tampered, refuseBadMAC)
	// A load message's envelope is not an evidence message's: the subject is in the MAC.
	c := newKeyedCluster(testConfig(), 2, testKey)
	wrongKind := append(make([]byte, authHeader), appendRecord(appendHeader(nil, 2), 5, cps)[1:]...)
	c.signers[signPublisher].seal(kindLoad, wrongKind, now)
	f("sealed for the load subject", testKey, wrongKind, refuseBadMAC)
}

func TestEnvelopeReplayed(t *testing.T) {
	c := newKeyedCluster(testConfig(), 1, testKey)
	now := time.Now().UnixNano()
	first := sealedEvidence(testKey, 2, now, 5, chain(1, 4))
	second := sealedEvidence(testKey, 2, now+1, 5, chain(2, 4))
	for i, m := range []struct {
		msg  []byte
		want int
	}{{first, -1}, {second, -1}, {first, refuseReplayed}, {second, refuseReplayed}} {
		if err := c.applyEvidence(m.msg); refusalOf(err) != m.want || (m.want == -1) != (err == nil) {
			t.Fatalf("message %d: %v; want reason %d", i, err, m.want)
		}
	}
}

func TestEvidenceRateAndPeers(t *testing.T) {
	cfg := testConfig()
	cfg.PeerEvidencePerSec = 10
	cfg.MaxPeers = 3
	c := newTestCluster(cfg)
	msg := func(from uint64, records int) []byte {
		b := appendHeader(nil, from)
		for i := 0; i < records; i++ {
			b = appendRecord(b, 5, chain(uint64(from<<8)+uint64(i), 4))
		}
		return b
	}
	// A second's worth, then nothing: one peer cannot flood the table.
	if err := c.applyEvidence(msg(2, 10)); err != nil {
		t.Fatal(err)
	}
	if err := c.applyEvidence(msg(2, 1)); refusalOf(err) != refuseRateLimited {
		t.Fatalf("over the rate: %v; want rate_limited", err)
	}
	// Other peers have their own buckets, up to max_peers.
	for from := uint64(3); from <= 4; from++ {
		if err := c.applyEvidence(msg(from, 5)); err != nil {
			t.Fatalf("peer %d: %v", from, err)
		}
	}
	if err := c.applyEvidence(msg(9, 1)); refusalOf(err) != refuseTooManyPeers {
		t.Fatalf("a peer beyond max_peers: %v; want too_many_peers", err)
	}
}
