//go:build cgo

package kvindex

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/tinylib/msgp/msgp"

	"github.com/rolter-ai/rolter/internal/freeport"
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

// trustIs reports whether st's trust is s/r.
func trustIs(st *Stream, s TrustState, r TrustReason) bool {
	gs, gr := st.Trust()
	return gs == s && gr == r
}

func newTestContext(t testing.TB) *zmq.Context {
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
	t        testing.TB
	sock     *zmq.Socket
	endpoint string
}

// newTestPub binds on 127.0.0.1 (connect mode) or, when connectTo is set, connects to the gateway's bound
// SUB (bind mode).
func newTestPub(t testing.TB, zctx *zmq.Context, connectTo string) *testPub {
	t.Helper()
	return newTestPubWith(t, zctx, connectTo, nil)
}

// newTestPubWith is newTestPub with setup applied to the socket before it binds or connects (security
// options take effect at the handshake).
func newTestPubWith(t testing.TB, zctx *zmq.Context, connectTo string, setup func(*zmq.Socket) error) *testPub {
	t.Helper()
	sock, err := zctx.NewSocket(zmq.XPUB)
	if err != nil {
		t.Fatalf("cannot create XPUB: %s", err)
	}
	t.Cleanup(func() { _ = sock.Close() })
	_ = sock.SetLinger(0)
	_ = sock.SetRcvtimeo(10 * time.Second)
	// Report every subscription: a publisher that reconnects keeps its pipe, and with it the old
	// subscription, so the new one would otherwise pass unseen.
	_ = sock.SetXpubVerbose(1)
	if setup != nil {
		if err := setup(sock); err != nil {
			t.Fatalf("cannot set up XPUB: %s", err)
		}
	}
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

// waitSubscribed waits for a subscription, skipping the unsubscriptions of subscribers that went away.
func (p *testPub) waitSubscribed() {
	p.t.Helper()
	for {
		msg, err := p.sock.RecvBytes(0)
		if err != nil || len(msg) == 0 {
			p.t.Fatalf("no subscription arrived: %q %v", msg, err)
		}
		if msg[0] == 1 {
			return
		}
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

// paddedPayload is seqPayload(seq) (the same block) with a trailing batch element of pad bytes, which
// the decoder skips.
func paddedPayload(seq uint64, pad int) []byte {
	b := msgp.AppendArrayHeader(nil, 4)
	b = msgp.AppendFloat64(b, 1700000000.5)
	b = msgp.AppendArrayHeader(b, 1)
	b = append(b, storedEvent([]uint64{1000 + seq}, 0, []uint32{uint32(seq), uint32(seq)}, 2)...)
	b = msgp.AppendInt(b, 0)
	return msgp.AppendBytes(b, make([]byte, pad))
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
	return serveReplay(t, zctx, replayOpts{layout: layout, topic: topic, seqs: seqs})
}

type replayOpts struct {
	layout, topic string
	seqs          []uint64
	// payload returns the batch of seq; nil means seqPayload.
	payload func(seq uint64) []byte
	// hold, when set, delays every answer until it is closed: the subscriber's applier waits in Replay.
	hold <-chan struct{}
}

func serveReplay(t *testing.T, zctx *zmq.Context, o replayOpts) *replayServer {
	t.Helper()
	layout, topic, seqs := o.layout, o.topic, o.seqs
	payload := o.payload
	if payload == nil {
		payload = seqPayload
	}
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
			if o.hold != nil {
				for held := true; held && !rs.stop.Load(); {
					select {
					case <-o.hold:
						held = false
					case <-time.After(50 * time.Millisecond):
					}
				}
			}
			start := binary.BigEndian.Uint64(msg[2])
			id := msg[0]
			for _, s := range seqs {
				if s < start {
					continue
				}
				if layout == "post" {
					_, _ = sock.SendMessage(id, []byte{}, []byte(topic), be64(s), payload(s))
				} else {
					_, _ = sock.SendMessage(id, []byte{}, be64(s), payload(s))
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
	if stats.Trusted || stats.Trust != TrustFallback || stats.Reason != ReasonGap || stats.ReplaysFailed != 1 || residentOn(ix, 0, 0) || !residentOn(ix, 0, 4) {
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
	waitFor(t, "stale", func() bool { return trustIs(st, TrustFallback, ReasonStale) })
	pub.publish("", 1)
	waitFor(t, "seq 1", func() bool { return st.Stats().LastSeq == 1 })
	// Trusted again, unless the machine stalled long enough for the next stale transition.
	if stats := st.Stats(); !stats.Trusted && stats.StaleTransitions < 2 {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(port)
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

// addTarget subscribes target 0 of ix and starts s; in bind mode it returns the endpoint publishers
// connect to, in connect mode the publisher's.
func addTarget(t *testing.T, zctx *zmq.Context, s *Subscriber, cfg SubscriberConfig) (*Stream, *testPub) {
	t.Helper()
	var pub *testPub
	if cfg.Mode == "bind" {
		cfg.Endpoint = "tcp://127.0.0.1:" + freePort(t)
	} else {
		pub = newTestPub(t, zctx, "")
		cfg.Endpoint = pub.endpoint
	}
	st, err := s.Add(0, cfg)
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	if pub == nil {
		pub = newTestPub(t, zctx, cfg.Endpoint)
	}
	pub.waitSubscribed()
	return st, pub
}

func TestSubscriberMaxMessageBytes(t *testing.T) {
	// A frame over MaxMessageBytes never reaches the index: libzmq disconnects its sender. In connect mode
	// libzmq would not reconnect after that (a protocol error), so the subscriber reopens its socket; in
	// bind mode the publisher reconnects. Either way the stream goes on and the lost batch is a gap.
	const limit = 64 << 10
	f := func(mode, oversized string) {
		t.Helper()
		zctx := newTestContext(t)
		ix := NewIndex(1)
		s := newTestSubscriber(t, ix)
		st, pub := addTarget(t, zctx, s, SubscriberConfig{Mode: mode, MaxMessageBytes: limit})
		pub.publish("", 0, 1)
		waitFor(t, "seq 1", func() bool { return st.Stats().LastSeq == 1 })
		if oversized == "topic" {
			pub.send(make([]byte, limit+1), be64(2), seqPayload(2))
		} else {
			pub.send(nil, be64(2), paddedPayload(2, limit))
		}
		waitFor(t, "a disconnect", func() bool { return st.Stats().Disconnects == 1 })
		pub.waitSubscribed() // the subscriber is back
		pub.publish("", 3, 4)
		waitFor(t, "seq 4", func() bool { return st.Stats().LastSeq == 4 })
		stats := st.Stats()
		if !stats.Trusted || stats.Batches != 4 || stats.Gaps != 1 || stats.LostBatches != 1 || stats.Disconnects != 1 {
			t.Fatalf("%s %s: unexpected stats %+v", mode, oversized, stats)
		}
		if residentOn(ix, 0, 2) || !residentOn(ix, 0, 3) || !residentOn(ix, 0, 4) {
			t.Fatalf("%s %s: the oversized batch was applied or the stream did not go on", mode, oversized)
		}
	}
	f("connect", "payload")
	f("connect", "topic")
	f("bind", "payload")
	f("bind", "topic")
}

// zmtpPeer speaks just enough ZMTP 3.0 (NULL mechanism, PUB) over a plain TCP connection to announce a
// frame without sending it.
func zmtpPeer(t *testing.T, endpoint string) net.Conn {
	t.Helper()
	var conn net.Conn
	// Until the subscriber has bound its socket.
	waitFor(t, "a connection", func() bool {
		var err error
		conn, err = net.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
		return err == nil
	})
	t.Cleanup(func() { _ = conn.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3 // signature, version 3.0
	copy(greeting[12:], "NULL")
	ready := []byte{0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11}
	ready = append(ready, "Socket-Type"...)
	ready = append(ready, 0, 0, 0, 3, 'P', 'U', 'B')
	if _, err := conn.Write(append(greeting, ready...)); err != nil {
		t.Fatalf("cannot send the greeting: %s", err)
	}
	// Wait for the subscriber's greeting and READY (and its subscription) before announcing the frame.
	buf := make([]byte, 64+27)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil {
		t.Fatalf("no ZMTP handshake: %s", err)
	}
	return conn
}

func TestSubscriberOversizedFrameHeader(t *testing.T) {
	// A peer announcing a 300 MiB frame is disconnected after the 9-byte frame header: libzmq checks the
	// announced size against ZMQ_MAXMSGSIZE before allocating anything. Without the limit the connection
	// stays open and libzmq allocates the frame and buffers whatever arrives.
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	st, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind"})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	conn := zmtpPeer(t, endpoint)
	header := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0} // long frame, last
	binary.BigEndian.PutUint64(header[1:], 300<<20)
	if _, err := conn.Write(header); err != nil {
		t.Fatalf("cannot announce the frame: %s", err)
	}
	// The subscriber closes the connection: the read ends with EOF or a reset, not with the deadline.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the subscriber kept the connection of a peer announcing a 300 MiB frame")
	}
	waitFor(t, "a disconnect", func() bool { return st.Stats().Disconnects == 1 })
	if stats := st.Stats(); stats.Batches != 0 || stats.GarbageFrames != 0 {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

func TestSubscriberReplayMaxMessageBytes(t *testing.T) {
	// A replayed batch over MaxMessageBytes is refused too: the replay fails and the target is cleared.
	const limit = 32 << 10
	zctx := newTestContext(t)
	rs := serveReplay(t, zctx, replayOpts{layout: "post", topic: "kv", seqs: []uint64{2}, payload: func(seq uint64) []byte {
		return paddedPayload(seq, limit)
	}})
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	s.replayTimeout = 500 * time.Millisecond
	st, pub := addTarget(t, zctx, s, SubscriberConfig{ReplayEndpoint: rs.endpoint, MaxMessageBytes: limit})
	pub.publish("kv", 0, 1, 3)
	// LastSeq moves when the gap is seen, before the replay fails and batch 3 is applied: wait for both.
	waitFor(t, "the failed replay and batch 3", func() bool {
		s := st.Stats()
		return s.LastSeq == 3 && s.ReplaysFailed == 1 && residentOn(ix, 0, 3)
	})
	stats := st.Stats()
	if stats.Trusted || stats.ReplaysFailed != 1 || stats.ReplaysOK != 0 || residentOn(ix, 0, 2) || !residentOn(ix, 0, 3) {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

func TestSubscriberQueueBound(t *testing.T) {
	// While the applier waits for a replay, the reader goes on draining the socket into the queue, which
	// holds at most MaxQueueBytes (payload plus queuedOverhead per message) and the message bound. What does
	// not fit is dropped and counted, and the applier meets a loss marker where the batches would have
	// been: the target is untrusted at once, and the next batch's gap is replayed.
	f := func(name string, maxQueueBytes int64, maxMsgs, pad, n int) {
		t.Helper()
		zctx := newTestContext(t)
		pub := newTestPub(t, zctx, "")
		payload := func(seq uint64) []byte { return paddedPayload(seq, pad) }
		last := uint64(4 + n) // 0, 1, 3 | 4..4+n-1 while the replay waits | 4+n after it
		var all []uint64
		for seq := uint64(0); seq <= last; seq++ {
			all = append(all, seq)
		}
		hold := make(chan struct{})
		rs := serveReplay(t, zctx, replayOpts{layout: "post", seqs: all, payload: payload, hold: hold})
		ix := NewIndex(1)
		s := newTestSubscriber(t, ix)
		s.replayTimeout = 20 * time.Second
		if maxMsgs > 0 {
			s.queueMessages = maxMsgs
		}
		st, err := s.Add(0, SubscriberConfig{Endpoint: pub.endpoint, ReplayEndpoint: rs.endpoint,
			MaxMessageBytes: int64(pad) + 1024, MaxQueueBytes: maxQueueBytes})
		if err != nil {
			t.Fatalf("%s: cannot add: %s", name, err)
		}
		s.Start(context.Background())
		pub.waitSubscribed()
		publish := func(seqs ...uint64) {
			for _, seq := range seqs {
				pub.send(nil, be64(seq), payload(seq))
			}
		}
		publish(0, 1, 3)
		waitFor(t, "the replay request", func() bool { return rs.requests.Load() == 1 })
		// What fits: the queue is FIFO and nothing leaves it while the applier waits.
		maxBytes := maxQueueBytes
		if maxBytes == 0 {
			maxBytes = DefaultMaxQueueBytes
		}
		fits, bytes := 0, int64(0)
		for seq := uint64(4); seq < 4+uint64(n); seq++ {
			c := charge(payload(seq))
			if fits == s.queueMessages || bytes+c > maxBytes {
				break
			}
			fits, bytes = fits+1, bytes+c
		}
		if fits == n {
			t.Fatalf("%s: BUG in the test: everything fits", name)
		}
		for seq := uint64(4); seq < 4+uint64(n); seq++ {
			publish(seq)
		}
		waitFor(t, "the drops", func() bool { return st.Stats().QueueDrops == uint64(n-fits) })
		q := s.workers[0].q
		if msgs, b := q.usage(); msgs != fits || b != bytes {
			t.Fatalf("%s: queue holds %d messages, %d bytes; want %d, %d", name, msgs, b, fits, bytes)
		}
		if ts, tr := st.Trust(); ts != TrustDegraded || tr != ReasonReplaying {
			// Degraded by the replay in progress.
			t.Fatalf("%s: trust %s/%s during the replay", name, ts, tr)
		}
		close(hold)
		lastKept := 4 + uint64(fits) - 1
		// The batches that fit are applied (each one trusts the target again), then the loss marker after
		// them untrusts it, although every batch applied so far was contiguous.
		waitFor(t, "the loss marker", func() bool { return st.Stats().LastSeq == lastKept && trustIs(st, TrustDegraded, ReasonGap) })
		if st.Trusted() {
			t.Fatalf("%s: trusted after the queue dropped batches", name)
		}
		publish(last)
		waitFor(t, "trusted after replaying the drops", func() bool { return st.Stats().LastSeq == last && st.Trusted() })
		stats := st.Stats()
		if stats.Gaps != 2 || stats.ReplaysOK != 2 || stats.LostBatches != 1+uint64(n-fits) || stats.QueueDrops != uint64(n-fits) {
			t.Fatalf("%s: unexpected stats %+v", name, stats)
		}
		for seq := uint64(0); seq <= last; seq++ {
			if !residentOn(ix, 0, seq) {
				t.Fatalf("%s: block of seq %d is not resident", name, seq)
			}
		}
	}
	f("bytes", 1<<20, 0, 64<<10, 40)
	f("messages", 0, 50, 16, 200)
}

func TestSubscriberForgedSequence(t *testing.T) {
	// A peer that reaches a bound SUB can publish with any sequence. One forged message near 2^64 between
	// two batches of the real publisher costs one batch interval of trust and no counter but
	// ImplausibleJumps; two in a row make the real publisher's next batch look like a restart, which
	// clears the target and recovers. lost_batches never moves.
	forgedBlock := []uint32{66, 66}
	f := func(forged []uint64, wantResidentFrom uint64, wantGaps, wantRestarts uint64) {
		t.Helper()
		zctx := newTestContext(t)
		ix := NewIndex(1)
		s := newTestSubscriber(t, ix)
		st, real := addTarget(t, zctx, s, SubscriberConfig{Mode: "bind"})
		forger := newTestPub(t, zctx, s.workers[0].cfg.Endpoint)
		forger.waitSubscribed()
		var seqs []uint64
		for seq := uint64(0); seq < 20; seq++ {
			seqs = append(seqs, seq)
		}
		real.publish("", seqs[:10]...)
		waitFor(t, "seq 9", func() bool { return st.Stats().LastSeq == 9 })
		for _, seq := range forged {
			forger.send(nil, be64(seq), batchOf(storedEvent([]uint64{666}, 0, forgedBlock, 2)))
		}
		waitFor(t, "the forged messages", func() bool { return st.Stats().ImplausibleJumps == uint64(len(forged)) })
		real.publish("", seqs[10:]...)
		waitFor(t, "trusted at seq 19", func() bool { return st.Stats().LastSeq == 19 && st.Trusted() })
		stats := st.Stats()
		if stats.LostBatches != 0 || stats.Gaps != wantGaps || stats.Restarts != wantRestarts || stats.ImplausibleJumps != uint64(len(forged)) {
			t.Fatalf("forged %v: unexpected stats %+v", forged, stats)
		}
		for seq := uint64(0); seq < 20; seq++ {
			if got, want := residentOn(ix, 0, seq), seq >= wantResidentFrom; got != want {
				t.Fatalf("forged %v: block of seq %d resident=%v; want %v", forged, seq, got, want)
			}
		}
		if out, _ := matchAll(ix, forgedBlock, 1); out[0] != 0 {
			t.Fatalf("forged %v: the forged block is resident", forged)
		}
	}
	// Ignored: the real publisher goes on from 9 and the index never changed.
	f([]uint64{math.MaxUint64 - 4}, 0, 0, 0)
	// Followed: the stream resynchronises to the forged run (cleared), then the real publisher's 10 is a
	// restart (cleared again) and 11 trusts the target.
	f([]uint64{math.MaxUint64 - 4, math.MaxUint64 - 3}, 10, 1, 1)
	// Up to 2^64-1, where lastSeq+1 wraps to 0.
	f([]uint64{math.MaxUint64 - 1, math.MaxUint64}, 10, 1, 1)
}

func TestSubscriberFramesAndTopics(t *testing.T) {
	// A message of many frames is garbage and only one frame of it is held at a time; a long topic under
	// MaxMessageBytes is received, not queued, and ignored.
	zctx := newTestContext(t)
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	st, pub := addTarget(t, zctx, s, SubscriberConfig{MaxMessageBytes: 64 << 10})
	pub.publish("", 0)
	frames := [][]byte{nil, be64(1), seqPayload(1)}
	for i := 0; i < 100; i++ {
		frames = append(frames, make([]byte, 32<<10))
	}
	pub.send(frames...)
	pub.send(make([]byte, 60<<10), be64(1), seqPayload(1))
	waitFor(t, "seq 1", func() bool { return st.Stats().LastSeq == 1 })
	stats := st.Stats()
	if !stats.Trusted || stats.GarbageFrames != 1 || stats.Batches != 2 || stats.Disconnects != 0 || !residentOn(ix, 0, 1) {
		t.Fatalf("unexpected stats %+v", stats)
	}
}

// TestSubscriberRefusesBindInUse: a bind on an address another listener holds is refused when it is added,
// instead of retrying forever without receiving; one this subscriber's own socket holds is still taken (a
// reload's new socket waits for the old one to close).
func TestSubscriberRefusesBindInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	s := newTestSubscriber(t, NewIndex(3))
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	for _, ep := range []string{"tcp://" + ln.Addr().String(), "tcp://*:" + port} {
		if _, err := s.Add(0, SubscriberConfig{Endpoint: ep, Mode: "bind"}); err == nil || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("bind on %s, which another listener holds: %v, want refused as in use", ep, err)
		}
	}
	if s.Stream(0) != nil {
		t.Fatal("a refused subscription has a stream")
	}
	free := "tcp://127.0.0.1:" + freePort(t)
	if _, err := s.Add(0, SubscriberConfig{Endpoint: free, Mode: "bind", Topic: "a"}); err != nil {
		t.Fatalf("free address: %s", err)
	}
	s.Start(context.Background())
	waitFor(t, "the bind", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(free, "tcp://"))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	// Another socket of this subscriber on the same address (other settings, so not shared): allowed.
	if _, err := s.Add(1, SubscriberConfig{Endpoint: free, Mode: "bind", Topic: "b", MaxBlocks: 7}); err != nil {
		t.Fatalf("an address this subscriber holds: %s", err)
	}
}
