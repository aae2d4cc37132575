//go:build cgo

package kvindex

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond until it holds; the bound only guards against a hang, it asserts no timing.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newTestContext(t *testing.T) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatalf("cannot create zmq context: %s", err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	return zctx
}

// testPub is an XPUB socket, used only by the test goroutine: unlike PUB it reports subscriptions, so the
// test publishes only once the subscriber's filter has arrived (no slow-joiner loss).
type testPub struct {
	t        *testing.T
	sock     *zmq.Socket
	endpoint string
}

// newTestPub binds on 127.0.0.1 (connect mode) or, when connectTo is set, connects to the gateway's bound
// SUB (bind mode).
func newTestPub(t *testing.T, zctx *zmq.Context, connectTo string) *testPub {
	t.Helper()
	sock, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatalf("cannot create XPUB: %s", err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(10 * time.Second)
	p := &testPub{t: t, sock: sock}
	if connectTo != "" {
		if err := sock.Connect(connectTo); err != nil {
			t.Fatalf("cannot connect XPUB: %s", err)
		}
		return p
	}
	if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatalf("cannot bind XPUB: %s", err)
	}
	if p.endpoint, err = sock.GetLastEndpoint(); err != nil {
		t.Fatalf("cannot get endpoint: %s", err)
	}
	return p
}

func (p *testPub) waitSubscribed() {
	p.t.Helper()
	msg, err := p.sock.RecvBytes(0)
	if err != nil || len(msg) == 0 || msg[0] != 1 {
		p.t.Fatalf("no subscription arrived: %q %v", msg, err)
	}
}

func (p *testPub) send(frames ...[]byte) {
	p.t.Helper()
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := p.sock.SendBytes(f, flag); err != nil {
			p.t.Fatalf("cannot publish: %s", err)
		}
	}
}

func (p *testPub) publish(topic string, seqs ...uint64) {
	p.t.Helper()
	for _, s := range seqs {
		p.send([]byte(topic), be64(s), seqPayload(s))
	}
}

// replayServer is a ROUTER answering replay requests like vLLM, owned by its own goroutine.
type replayServer struct {
	endpoint string
	requests atomic.Int64
	stop     atomic.Bool
	wg       sync.WaitGroup
}

// startReplayServer serves the batches of seqs in the "pre" (["", seq, payload], vLLM <= 0.25) or "post"
// (["", topic, seq, payload], vllm-project/vllm#45177) layout.
func startReplayServer(t *testing.T, zctx *zmq.Context, layout, topic string, seqs ...uint64) *replayServer {
	t.Helper()
	rs := &replayServer{}
	ready := make(chan error, 1)
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		sock, err := zctx.NewSocket(zmq.ROUTER)
		if err != nil {
			ready <- err
			return
		}
		defer sock.Close()
		_ = sock.SetLinger(0)
		_ = sock.SetRcvtimeo(50 * time.Millisecond)
		if err := sock.Bind("tcp://127.0.0.1:*"); err != nil {
			ready <- err
			return
		}
		rs.endpoint, _ = sock.GetLastEndpoint()
		ready <- nil
		end := be64(endSeq)
		for !rs.stop.Load() {
			msg, err := sock.RecvMessageBytes(0)
			if err != nil {
				continue
			}
			// vLLM accepts exactly [identity, "", start_seq].
			if len(msg) != 3 || len(msg[1]) != 0 {
				continue
			}
			rs.requests.Add(1)
			start := binary.BigEndian.Uint64(msg[2])
			id := msg[0]
			for _, s := range seqs {
				if s < start {
					continue
				}
				if layout == "post" {
					_, _ = sock.SendMessage(id, []byte{}, []byte(topic), be64(s), seqPayload(s))
				} else {
					_, _ = sock.SendMessage(id, []byte{}, be64(s), seqPayload(s))
				}
			}
			if layout == "post" {
				_, _ = sock.SendMessage(id, []byte{}, []byte{}, end, []byte{})
			} else {
				_, _ = sock.SendMessage(id, []byte{}, end, []byte{})
			}
		}
	}()
	if err := <-ready; err != nil {
		t.Fatalf("cannot start replay server: %s", err)
	}
	t.Cleanup(func() {
		rs.stop.Store(true)
		rs.wg.Wait()
	})
	return rs
}

func newTestSubscriber(t *testing.T, ix *Index) *Subscriber {
	t.Helper()
	s, err := NewSubscriber(ix, discardLogger)
	if err != nil {
		t.Fatalf("cannot create subscriber: %s", err)
	}
	t.Cleanup(s.Stop)
	return s
}

func residentOn(ix *Index, target int, seq uint64) bool {
	out, _ := matchAll(ix, []uint32{uint32(seq), uint32(seq)}, target+1)
	return out[target] == 1
}

func TestSubscriberApplies(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	ix := NewIndex(2)
	s := newTestSubscriber(t, ix)
	st, err := s.Add(1, SubscriberConfig{Endpoint: pub.endpoint, Topic: "kv@"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if s.Stream(1) != st || s.Stream(0) != nil {
		t.Fatalf("Stream returns the wrong stream")
	}
	s.Start(context.Background())
	pub.waitSubscribed()
	pub.publish("other", 9) // filtered out by the topic prefix
	pub.publish("kv@10.0.0.1:8000@m", 0, 1, 2)
	waitFor(t, "3 batches", func() bool { return st.Stats().LastSeq == 2 })
	stats := st.Stats()
	if !stats.Trusted || stats.Batches != 3 || stats.Blocks != 3 || stats.Gaps != 0 {
		t.Fatalf("unexpected stats %+v", stats)
	}
	for seq := uint64(0); seq < 3; seq++ {
		if !residentOn(ix, 1, seq) || residentOn(ix, 0, seq) {
			t.Fatalf("block of seq %d is not resident on target 1 only", seq)
		}
	}
	if residentOn(ix, 1, 9) {
		t.Fatalf("a message of another topic was applied")
	}
}

func TestSubscriberGapReplay(t *testing.T) {
	for _, layout := range []string{"pre", "post"} {
		t.Run(layout, func(t *testing.T) {
			zctx := newTestContext(t)
			pub := newTestPub(t, zctx, "")
			rs := startReplayServer(t, zctx, layout, "kv", 0, 1, 2, 3)
			ix := NewIndex(1)
			s := newTestSubscriber(t, ix)
			st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, ReplayEndpoint: rs.endpoint})
			if err != nil {
				t.Fatalf("cannot add: %s", err)
			}
			s.Start(context.Background())
			pub.waitSubscribed()
			pub.publish("kv", 0, 1, 3) // 2 is lost
			waitFor(t, "seq 3", func() bool { return st.Stats().LastSeq == 3 })
			stats := st.Stats()
			if !stats.Trusted || stats.Gaps != 1 || stats.ReplaysOK != 1 || stats.Clears != 0 || rs.requests.Load() != 1 {
				t.Fatalf("unexpected stats %+v (requests %d)", stats, rs.requests.Load())
			}
			for seq := uint64(0); seq <= 3; seq++ {
				if !residentOn(ix, 0, seq) {
					t.Fatalf("block of seq %d is not resident", seq)
				}
			}
		})
	}
}

func TestSubscriberReplayUnavailable(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	s.replayTimeout = 300 * time.Millisecond
	// Nothing listens on the replay port.
	st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, ReplayEndpoint: "tcp://127.0.0.1:" + freePort(t)})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	pub.waitSubscribed()
	pub.publish("", 0, 1, 4)
	waitFor(t, "seq 4", func() bool { return st.Stats().LastSeq == 4 })
	stats := st.Stats()
	if stats.Trusted || stats.Reason != ReasonGap || stats.ReplaysFailed != 1 || residentOn(ix, 0, 0) || !residentOn(ix, 0, 4) {
		t.Fatalf("unexpected stats %+v", stats)
	}
	pub.publish("", 5)
	waitFor(t, "trusted after the next contiguous batch", func() bool { return st.Trusted() })
}

func TestSubscriberRestartAndGarbage(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	pub.waitSubscribed()
	pub.publish("", 0, 1, 2)
	pub.send([]byte(""), be64(3))                        // two frames
	pub.send([]byte(""), []byte{0, 3}, seqPayload(3))    // short sequence frame
	pub.send([]byte(""), be64(3), []byte{0xc1, 0x00})    // undecodable payload
	pub.send([]byte(""), be64(4), []byte("not msgpack")) // and another one
	pub.publish("", 5)
	waitFor(t, "seq 5", func() bool { return st.Stats().LastSeq == 5 })
	stats := st.Stats()
	if !stats.Trusted || stats.GarbageFrames != 2 || stats.DecodeErrors != 2 || !residentOn(ix, 0, 5) || residentOn(ix, 0, 0) {
		t.Fatalf("unexpected stats %+v", stats)
	}
	// The engine restarts: its sequence starts over.
	pub.publish("", 0)
	waitFor(t, "restart", func() bool { return st.Stats().Restarts == 1 })
	stats = st.Stats()
	if !stats.Trusted || stats.Blocks != 1 || !residentOn(ix, 0, 0) || residentOn(ix, 0, 5) {
		t.Fatalf("unexpected stats after restart %+v", stats)
	}
}

func TestSubscriberStale(t *testing.T) {
	zctx := newTestContext(t)
	pub := newTestPub(t, zctx, "")
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, StaleAfter: 400 * time.Millisecond})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	pub.waitSubscribed()
	pub.publish("", 0)
	waitFor(t, "stale", func() bool { return st.Reason() == ReasonStale })
	pub.publish("", 1)
	waitFor(t, "seq 1", func() bool { return st.Stats().LastSeq == 1 })
	// Trusted again, unless the machine stalled long enough for the next stale transition.
	if stats := st.Stats(); !stats.Trusted && stats.StaleTransitions < 2 {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("cannot listen: %s", err)
	}
	defer ln.Close()
	return fmt.Sprint(ln.Addr().(*net.TCPAddr).Port)
}

func TestSubscriberBindMode(t *testing.T) {
	zctx := newTestContext(t)
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	st, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	// The engine connects (llm-d style) and, like llm-d-inference-sim, numbers from 1.
	pub := newTestPub(t, zctx, endpoint)
	pub.waitSubscribed()
	pub.publish("kv@127.0.0.1:8000@m", 1, 2)
	waitFor(t, "seq 2", func() bool { return st.Stats().LastSeq == 2 })
	if stats := st.Stats(); !stats.Trusted || stats.Batches != 2 || !residentOn(ix, 0, 1) || !residentOn(ix, 0, 2) {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

func TestSubscriberLifecycle(t *testing.T) {
	before := runtime.NumGoroutine()
	ix := NewIndex(3)
	s, err := NewSubscriber(ix, discardLogger)
	if err != nil {
		t.Fatalf("cannot create subscriber: %s", err)
	}
	if _, err := s.Add(0, SubscriberConfig{Endpoint: "udp://x"}); err == nil {
		t.Fatalf("expected an error for a bad endpoint")
	}
	if _, err := s.Add(5, SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}); err == nil {
		t.Fatalf("expected an error for a target out of range")
	}
	if _, err := s.Add(0, SubscriberConfig{Endpoint: "tcp://127.0.0.1:" + freePort(t), ReplayEndpoint: "tcp://127.0.0.1:1"}); err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if _, err := s.Add(0, SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}); err == nil {
		t.Fatalf("expected an error for a duplicate target")
	}
	s.Start(context.Background())
	// Added after Start: starts at once. A bind that fails is retried, not fatal.
	if _, err := s.Add(1, SubscriberConfig{Endpoint: "tcp://127.0.0.1:" + freePort(t), Mode: "bind"}); err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if _, err := s.Add(2, SubscriberConfig{Endpoint: "tcp://256.0.0.1:1", Mode: "bind"}); err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	time.Sleep(300 * time.Millisecond)
	s.Remove(1)
	if s.Stream(1) != nil {
		t.Fatalf("removed target still has a stream")
	}
	s.Stop()
	s.Stop() // idempotent
	if _, err := s.Add(1, SubscriberConfig{Endpoint: "tcp://127.0.0.1:1"}); err == nil {
		t.Fatalf("expected an error after Stop")
	}
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}
