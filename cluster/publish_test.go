package cluster

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
)

// testConfig is a small cluster config for tests that build a Cluster without NATS.
func testConfig() config.ClusterConfig {
	return config.ClusterConfig{NATSURL: "nats://127.0.0.1:1", Subject: "t", PublishIntervalMs: 20, MaxEntries: 1024,
		EvidenceTTLSecs: 60, QueueSize: 64}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestCluster is a Cluster without NATS, goroutines or logs, id 1.
func newTestCluster(cfg config.ClusterConfig) *Cluster {
	c := newCluster(cfg, nopGateway{}, 1, nil)
	c.log = quietLog
	return c
}

// nopGateway is a Gateway with no providers.
type nopGateway struct{}

func (nopGateway) SetPeers(engine.Peers)                {}
func (nopGateway) SetPeerLoads(map[string]int64)        {}
func (nopGateway) Inflight(func(string, int64))         {}
func (nopGateway) SetLimitShare(int)                    {}
func (c *Cluster) queued() int                          { return len(c.queue) }
func (c *Cluster) setSend(f func(string, []byte) error) { c.send = f }

// sentMessages collects what a Cluster without NATS publishes.
type sentMessages struct {
	mu   sync.Mutex
	msgs map[string][][]byte
	err  error
}

func (s *sentMessages) send(subject string, msg []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	if s.msgs == nil {
		s.msgs = map[string][][]byte{}
	}
	s.msgs[subject] = append(s.msgs[subject], append([]byte(nil), msg...))
	return nil
}

func TestRoutedNeverBlocks(t *testing.T) {
	// Nobody drains the queue: Routed keeps returning, and counts what it drops.
	cfg := testConfig()
	cfg.QueueSize = 4
	c := newTestCluster(cfg)
	done := make(chan struct{})
	cps := chain(1, maxCheckpoints+10) // more than a record holds: cut to maxCheckpoints
	go func() {
		defer close(done)
		for i := 0; i < 10000; i++ {
			c.Routed(uint64(i), cps)
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Routed blocked on a full queue")
	}
	if got := c.dropped[dropQueueFull].Load(); got != 10000-4 {
		t.Fatalf("queue_full = %d; want %d", got, 10000-4)
	}
	if r := <-c.queue; r.n != maxCheckpoints || r.cps[0] != cps[0] || r.engine != 0 {
		t.Fatalf("queued record: engine %d, %d cps", r.engine, r.n)
	}
	c.Routed(1, nil) // nothing to say
	if n := c.queued(); n != 3 {
		t.Fatalf("%d queued; want 3", n)
	}
}

func TestRoutedDoesNotKeepCps(t *testing.T) {
	c := newTestCluster(testConfig())
	cps := chain(1, 5)
	c.Routed(3, cps)
	cps[0] = 0
	if r := <-c.queue; r.cps[0] == 0 {
		t.Fatal("the queued record aliases the caller's slice")
	}
}

func TestFlushEvidence(t *testing.T) {
	cfg := testConfig()
	cfg.QueueSize = 1024
	c := newCluster(cfg, nopGateway{}, 77, nil)
	c.log = quietLog
	var s sentMessages
	c.setSend(s.send)
	// 100 distinct records of 96 checkpoints (777 bytes each) and 50 repeats of one.
	for i := 0; i < 100; i++ {
		c.Routed(uint64(i%4), chain(uint64(i), maxCheckpoints))
	}
	for i := 0; i < 50; i++ {
		c.Routed(9, chain(1000, 3))
	}
	c.flushEvidence()
	msgs := s.msgs["t.evidence"]
	records, cps := 0, 0
	for _, m := range msgs {
		if len(m) > batchBytes {
			t.Fatalf("a message of %d bytes; want at most %d", len(m), batchBytes)
		}
		from, recs, err := parseEvidence(m)
		if err != nil || from != 77 {
			t.Fatalf("sent a message it cannot read: from %d, %v", from, err)
		}
		r := recordReader{recs}
		for {
			_, b, ok := r.next()
			if !ok {
				break
			}
			records++
			cps += len(b) / 8
		}
	}
	if records != 101 || cps != 100*maxCheckpoints+3 {
		t.Fatalf("sent %d records with %d checkpoints; want 101 (the repeats once) with %d", records, cps,
			100*maxCheckpoints+3)
	}
	if want := (100*recordBytes(maxCheckpoints) + batchBytes - 1) / batchBytes; len(msgs) < want || len(msgs) > want+1 {
		t.Fatalf("%d messages; want about %d", len(msgs), want)
	}
	if got := c.sent[kindEvidence].Load(); got != uint64(len(msgs)) {
		t.Fatalf("evidence sent = %d; want %d", got, len(msgs))
	}
	// Nothing queued: nothing sent.
	c.flushEvidence()
	if n := len(s.msgs["t.evidence"]); n != len(msgs) {
		t.Fatalf("an empty flush sent a message")
	}
	// The repeat is sent again in the next interval.
	c.tick()
	c.Routed(9, chain(1000, 3))
	c.flushEvidence()
	if n := len(s.msgs["t.evidence"]); n != len(msgs)+1 {
		t.Fatalf("a record of the last interval was not sent again in this one")
	}
}

func TestPublishFailed(t *testing.T) {
	c := newTestCluster(testConfig())
	s := sentMessages{err: errNotConnected}
	c.setSend(s.send)
	c.Routed(1, chain(1, 3))
	c.tick()
	if got := c.dropped[dropPublishFailed].Load(); got != 2 { // the evidence and the load message
		t.Fatalf("publish_failed = %d; want 2", got)
	}
	if c.queued() != 0 {
		t.Fatal("the queue is not drained while NATS is down")
	}
	s.err = errors.New("nats: maximum payload exceeded")
	c.tick()
	if got := c.dropped[dropPublishFailed].Load(); got != 3 {
		t.Fatalf("publish_failed = %d; want 3", got)
	}
}
