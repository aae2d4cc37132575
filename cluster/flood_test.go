package cluster

import (
	"testing"
	"time"

	"github.com/rolter-ai/rolter/cluster/natstest"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
)

func TestEvidenceFlood(t *testing.T) {
	// One replica sends the evidence of 100k distinct prompts (1.6M checkpoints); the other's table keeps
	// its 4096 slots and its heap does not grow with the flood.
	ns := natstest.New(t)
	cfg := config.ClusterConfig{NATSURL: ns.URL(), Subject: "flood", PublishIntervalMs: 20, MaxEntries: 4096,
		EvidenceTTLSecs: 600, QueueSize: 4096,
		PeerEvidencePerSec: 1 << 20} // the table's bound under test, not the sender's rate
	start := func() *Cluster {
		c, err := Start(cfg, egress.DefaultConfig(), nopGateway{}, quietLog)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}
	sender, receiver := start(), start()
	poll(t, "the replicas to hear from each other", func() bool {
		return sender.Stats().Peers == 1 && receiver.Stats().Peers == 1
	})
	const cpsPerKey = 16
	flood := func(from, n int) {
		for i := from; i < from+n; i++ {
			for sender.queued() > cfg.QueueSize/2 {
				time.Sleep(time.Millisecond) // the test's own pacing: Routed never waits
			}
			sender.Routed(uint64(i%8), chain(uint64(i), cpsPerKey))
		}
		poll(t, "the flood to arrive", func() bool {
			s, r := sender.Stats(), receiver.Stats()
			return sender.queued() == 0 && r.EvidenceReceived+r.SlowConsumer >= s.EvidenceSent
		})
	}
	flood(0, 10000)
	heap0 := heapInUse()
	flood(10000, 100000)
	last := chain(uint64(110000-1), cpsPerKey)
	poll(t, "the last key's evidence", func() bool { return receiver.Held(uint64((110000-1)%8), last) == cpsPerKey })
	heap1 := heapInUse()
	s := receiver.Stats()
	if s.Slots != 4096 || s.Entries > s.Slots || s.Malformed != 0 {
		t.Fatalf("receiver after the flood: %+v", s)
	}
	if s.EvidenceReceived < 100 {
		t.Fatalf("only %d evidence messages: the flood did not happen", s.EvidenceReceived)
	}
	if grown := int64(heap1) - int64(heap0); grown > 16<<20 {
		t.Fatalf("heap grew by %d bytes over 100k prompts; want it bounded", grown)
	}
	t.Logf("%d messages, %d drops (queue full), heap %d -> %d bytes", s.EvidenceReceived,
		sender.Stats().QueueFull, heap0, heap1)
}

// poll waits for cond, failing the test after 90 s: a bound for a hang, generous enough for a race build
// on a shared 2-core machine, where the flood alone takes tens of seconds.
func poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
