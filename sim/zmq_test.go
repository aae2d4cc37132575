//go:build cgo

package sim

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

func newZMQContext(t *testing.T) *zmq.Context {
	t.Helper()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = zctx.Term() })
	return zctx
}

func newSocket(t *testing.T, zctx *zmq.Context, typ zmq.Type) *zmq.Socket {
	t.Helper()
	s, err := zctx.NewSocket(typ)
	if err != nil {
		t.Fatal(err)
	}
	_ = s.SetLinger(0)
	_ = s.SetRcvtimeo(200 * time.Millisecond)
	t.Cleanup(func() { _ = s.Close() }) // runs before the context's Term
	return s
}

func newSub(t *testing.T, endpoint, topic string) *zmq.Socket {
	t.Helper()
	sub := newSocket(t, newZMQContext(t), zmq.SUB)
	if err := sub.SetSubscribe(topic); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(endpoint); err != nil {
		t.Fatal(err)
	}
	return sub
}

// recv returns the next message, or nil after the receive timeout.
func recv(t *testing.T, s *zmq.Socket) [][]byte {
	t.Helper()
	msg, err := s.RecvMessageBytes(0)
	if err != nil {
		if zmq.AsErrno(err) == zmq.Errno(11) { // EAGAIN: timeout
			return nil
		}
		t.Fatalf("recv: %s", err)
	}
	return msg
}

// syncSub waits out the slow-joiner window: PUB drops messages until the subscription has
// reached it, so restart the engine (one AllBlocksCleared batch each) until one arrives, then
// drain.
func syncSub(t *testing.T, e *Engine, sub *zmq.Socket) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		e.Restart()
		if recv(t, sub) != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subscriber never received a batch")
		}
	}
	for recv(t, sub) != nil {
	}
}

// recvBatch receives one message and checks it is a [topic, seq, batch] triple.
func recvBatch(t *testing.T, sub *zmq.Socket, topic string) (uint64, testBatch) {
	t.Helper()
	var msg [][]byte
	for deadline := time.Now().Add(5 * time.Second); msg == nil; {
		if msg = recv(t, sub); msg == nil && time.Now().After(deadline) {
			t.Fatalf("no batch received")
		}
	}
	if len(msg) != 3 || string(msg[0]) != topic || len(msg[1]) != 8 {
		t.Fatalf("message frames %q", msg)
	}
	b, err := decodeBatch(msg[2])
	if err != nil {
		t.Fatalf("cannot decode batch %x: %s", msg[2], err)
	}
	if b.rank != 0 || b.ts < 1e9 {
		t.Fatalf("batch rank %d ts %v", b.rank, b.ts)
	}
	return binary.BigEndian.Uint64(msg[1]), b
}

// waitBatches waits until the engine has published n batches in total.
func waitBatches(t *testing.T, e *Engine, n uint64) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d batches", n), func() bool { return e.Stats().BatchesPublished >= n })
}

// tokenize returns the ids /tokenize gives for a chat body.
func tokenize(t *testing.T, c *client, e *Engine, body string) []uint32 {
	t.Helper()
	status, _, b, err := c.post(e.URL()+"/tokenize", body)
	var tok struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err != nil || status != 200 || json.Unmarshal(b, &tok) != nil {
		t.Fatalf("/tokenize: %d %s %v", status, b, err)
	}
	return tok.Tokens
}

func TestKVEventsRoundTrip(t *testing.T) {
	f := func(era Era, mode HashMode) {
		t.Helper()
		cfg := testConfig()
		cfg.KVEvents = "tcp://127.0.0.1:*"
		cfg.Topic = "kv-events"
		cfg.Era = era
		cfg.HashMode = mode
		e := startEngine(t, cfg)
		sub := newSub(t, e.KVEventsEndpoint(), "kv-events")
		syncSub(t, e, sub)
		c := newClient(t, 10*time.Second)

		e.Restart()
		seq, b := recvBatch(t, sub, "kv-events")
		if seq != 0 || len(b.events) != 1 || b.events[0].typ != "AllBlocksCleared" {
			t.Fatalf("%s: after restart seq %d events %+v", era, seq, b.events)
		}
		body := chatBody(words("events", 60), "")
		tokens := tokenize(t, c, e, body)
		c.completion(e.URL()+"/v1/chat/completions", body)
		seq, b = recvBatch(t, sub, "kv-events")
		full := len(tokens) / 16 * 16
		if seq != 1 || len(b.events) != 1 {
			t.Fatalf("%s: seq %d events %+v", era, seq, b.events)
		}
		ev := b.events[0]
		wantMedium := ""
		if eraFormats[era].medium {
			wantMedium = "GPU"
		}
		if ev.typ != "BlockStored" || ev.parent != nil || ev.blockSize != 16 || ev.medium != wantMedium ||
			fmt.Sprint(ev.hashes) != fmt.Sprint(wire(tokens, 16)) || fmt.Sprint(ev.tokens) != fmt.Sprint(tokens[:full]) {
			t.Fatalf("%s: BlockStored %+v, want hashes %v", era, ev, wire(tokens, 16))
		}
	}
	f(EraMap, HashInt)
	f(EraPositional, HashBytes)
	f(EraLoraName, HashInt)
	f(EraV08, HashInt) // no medium field: decoder leaves it empty
}

func TestKVEventsConnectMode(t *testing.T) {
	// llm-d style: the subscriber binds, the engine's PUB connects.
	zctx := newZMQContext(t)
	sub := newSocket(t, zctx, zmq.SUB)
	_ = sub.SetSubscribe("")
	if err := sub.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	ep, _ := sub.GetLastEndpoint()
	cfg := testConfig()
	cfg.KVEvents = ep
	e := startEngine(t, cfg)
	if e.KVEventsEndpoint() != ep {
		t.Fatalf("KVEventsEndpoint %q, want %q", e.KVEventsEndpoint(), ep)
	}
	syncSub(t, e, sub)
	e.Restart()
	if seq, b := recvBatch(t, sub, ""); seq != 0 || b.events[0].typ != "AllBlocksCleared" {
		t.Fatalf("seq %d events %+v", seq, b.events)
	}
}

// replay sends a replay request from start and returns the (seq, payload) pairs and whether the
// end marker came, checking the frame layout.
func replay(t *testing.T, dealer *zmq.Socket, layout ReplayLayout, topic string, start uint64) ([]uint64, [][]byte) {
	t.Helper()
	req := binary.BigEndian.AppendUint64(nil, start)
	if _, err := dealer.SendMessage("", req); err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var payloads [][]byte
	for {
		msg := recv(t, dealer)
		if msg == nil {
			t.Fatalf("replay ended without the end marker after %v", seqs)
		}
		if len(msg[0]) != 0 {
			t.Fatalf("first frame %q is not the empty delimiter", msg[0])
		}
		msg = msg[1:]
		if layout == ReplayNew {
			// [topic, seq, payload]; the end marker has an empty topic.
			if len(msg) != 3 || len(msg[1]) != 8 {
				t.Fatalf("new layout reply %q", msg)
			}
			if wantTopic := topic; bytes.Equal(msg[1], endSeq) && len(msg[0]) != 0 || !bytes.Equal(msg[1], endSeq) && string(msg[0]) != wantTopic {
				t.Fatalf("new layout reply with topic frame %q", msg[0])
			}
			msg = msg[1:]
		}
		if len(msg) != 2 || len(msg[0]) != 8 {
			t.Fatalf("reply %q", msg)
		}
		if bytes.Equal(msg[0], endSeq) {
			if len(msg[1]) != 0 {
				t.Fatalf("end marker with payload %x", msg[1])
			}
			return seqs, payloads
		}
		seqs = append(seqs, binary.BigEndian.Uint64(msg[0]))
		payloads = append(payloads, msg[1])
	}
}

func TestReplayLayouts(t *testing.T) {
	for _, layout := range []ReplayLayout{ReplayNew, ReplayOld} {
		t.Run(layout.String(), func(t *testing.T) {
			cfg := testConfig()
			cfg.KVEvents = "tcp://127.0.0.1:*"
			cfg.Replay = "tcp://127.0.0.1:*"
			cfg.ReplayLayout = layout
			cfg.Topic = "t"
			e := startEngine(t, cfg)
			c := newClient(t, 10*time.Second)
			for i := range 3 {
				c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words(fmt.Sprint("replay", i), 40)+`"}`)
				waitBatches(t, e, uint64(i+1))
			}
			dealer := newSocket(t, newZMQContext(t), zmq.DEALER)
			if err := dealer.Connect(e.ReplayEndpoint()); err != nil {
				t.Fatal(err)
			}
			// A fresh engine numbers its batches from 0.
			seqs, payloads := replay(t, dealer, layout, "t", 0)
			if fmt.Sprint(seqs) != "[0 1 2]" {
				t.Fatalf("replay from 0: %v", seqs)
			}
			for _, p := range payloads {
				if b, err := decodeBatch(p); err != nil || b.events[0].typ != "BlockStored" {
					t.Fatalf("replayed batch %+v: %v", b, err)
				}
			}
			// A malformed request is ignored; the next one is answered.
			if _, err := dealer.SendMessage("", "x", "y"); err != nil {
				t.Fatal(err)
			}
			if seqs, _ := replay(t, dealer, layout, "t", 2); fmt.Sprint(seqs) != "[2]" {
				t.Fatalf("replay from 2: %v", seqs)
			}
			if seqs, _ := replay(t, dealer, layout, "t", 9); len(seqs) != 0 {
				t.Fatalf("replay from 9: %v", seqs)
			}
		})
	}
}

func TestReplayBufferKeepsNewest(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	cfg.Replay = "tcp://127.0.0.1:*"
	cfg.ReplayBuffer = 2
	e := startEngine(t, cfg)
	c := newClient(t, 10*time.Second)
	for i := range 4 {
		c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words(fmt.Sprint("ring", i), 40)+`"}`)
		waitBatches(t, e, uint64(i+1))
	}
	dealer := newSocket(t, newZMQContext(t), zmq.DEALER)
	_ = dealer.Connect(e.ReplayEndpoint())
	if seqs, _ := replay(t, dealer, ReplayNew, "", 0); fmt.Sprint(seqs) != "[2 3]" {
		t.Fatalf("replay of a 2-batch buffer: %v", seqs)
	}
}

func TestFaultDropEveryNthBatch(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	cfg.Replay = "tcp://127.0.0.1:*"
	cfg.DropEveryNthBatch = 2 // seq 1, 3, … are not sent
	e := startEngine(t, cfg)
	sub := newSub(t, e.KVEventsEndpoint(), "")
	syncSub(t, e, sub)
	c := newClient(t, 10*time.Second)

	e.Restart()
	if seq, _ := recvBatch(t, sub, ""); seq != 0 {
		t.Fatalf("first seq %d", seq)
	}
	published := e.Stats().BatchesPublished
	c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words("dropped", 40)+`"}`)
	waitBatches(t, e, published+1)
	c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words("sent", 40)+`"}`)
	seq, b := recvBatch(t, sub, "")
	if seq != 2 || b.events[0].typ != "BlockStored" {
		t.Fatalf("after the dropped batch: seq %d %+v (want a gap: 0 then 2)", seq, b.events)
	}
	if st := e.Stats(); st.BatchesDropped == 0 {
		t.Fatalf("stats %+v", st)
	}
	// Replay fills the gap.
	dealer := newSocket(t, newZMQContext(t), zmq.DEALER)
	_ = dealer.Connect(e.ReplayEndpoint())
	if seqs, _ := replay(t, dealer, ReplayNew, "", 0); fmt.Sprint(seqs) != "[0 1 2]" {
		t.Fatalf("replay: %v", seqs)
	}
}

func TestFaultGarbageFrames(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	cfg.Topic = "g"
	e := startEngine(t, cfg)
	sub := newSub(t, e.KVEventsEndpoint(), "g")
	syncSub(t, e, sub)
	if err := e.SetFaults(Faults{GarbageEveryNBatches: 1}); err != nil {
		t.Fatal(err)
	}
	e.Restart()
	if seq, _ := recvBatch(t, sub, "g"); seq != 0 {
		t.Fatalf("seq %d", seq)
	}
	msg := recv(t, sub)
	if len(msg) != 3 || string(msg[0]) != "g" || len(msg[1]) == 8 {
		t.Fatalf("garbage message %q", msg)
	}
	if _, err := decodeBatch(msg[2]); err == nil {
		t.Fatalf("garbage payload %x decodes", msg[2])
	}
	// The counter moves after the send returns, maybe after the message arrived.
	eventually(t, "GarbageSent to count the message", func() bool { return e.Stats().GarbageSent == 1 })
}

func TestRestartResetsSequenceAndCache(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	e := startEngine(t, cfg)
	sub := newSub(t, e.KVEventsEndpoint(), "")
	syncSub(t, e, sub) // the sync batch was seq 0
	c := newClient(t, 10*time.Second)
	body := `{"prompt":"` + words("restart", 60) + `"}`
	c.completion(e.URL()+"/v1/completions", body)
	if seq, _ := recvBatch(t, sub, ""); seq != 1 {
		t.Fatalf("seq %d, want 1", seq)
	}
	c.completion(e.URL()+"/v1/completions", `{"prompt":"`+words("other", 60)+`"}`)
	if seq, _ := recvBatch(t, sub, ""); seq != 2 {
		t.Fatalf("seq %d, want 2", seq)
	}
	e.Restart()
	seq, b := recvBatch(t, sub, "")
	if seq != 0 || len(b.events) != 1 || b.events[0].typ != "AllBlocksCleared" {
		t.Fatalf("after restart: seq %d %+v", seq, b.events)
	}
	_, out := c.completion(e.URL()+"/v1/completions", body)
	if out.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cache survived the restart: %d cached tokens", out.Usage.PromptTokensDetails.CachedTokens)
	}
	if seq, b := recvBatch(t, sub, ""); seq != 1 || b.events[0].typ != "BlockStored" {
		t.Fatalf("after restart: seq %d %+v", seq, b.events)
	}
	if st := e.Stats(); st.Restarts < 2 || st.NextSeq != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEvictionOverHTTP(t *testing.T) {
	cfg := testConfig()
	cfg.KVEvents = "tcp://127.0.0.1:*"
	cfg.NumBlocks = 12 // 192 tokens
	e := startEngine(t, cfg)
	sub := newSub(t, e.KVEventsEndpoint(), "")
	syncSub(t, e, sub)
	c := newClient(t, 10*time.Second)
	a := `{"prompt":"` + words("first", 70) + `"}`
	b := `{"prompt":"` + words("second", 70) + `"}`
	_, outA := c.completion(e.URL()+"/v1/completions", a)
	if outA.Usage.PromptTokens < 100 || outA.Usage.PromptTokens > 170 {
		t.Fatalf("prompt A has %d tokens; the test needs 100..170", outA.Usage.PromptTokens)
	}
	_, first := recvBatch(t, sub, "")
	storedA := first.events[0].hashes
	c.completion(e.URL()+"/v1/completions", b)
	_, second := recvBatch(t, sub, "")
	removed := map[uint64]bool{}
	for _, ev := range second.events {
		if ev.typ == "BlockRemoved" {
			removed[ev.hashes[0]] = true
		}
	}
	if len(removed) == 0 || !removed[storedA[len(storedA)-1]] {
		t.Fatalf("B's batch %+v removed nothing of A's tail %v", second.events, storedA)
	}
	if st := e.Stats(); st.Evictions != uint64(len(removed)) {
		t.Fatalf("evictions %d, BlockRemoved %d", st.Evictions, len(removed))
	}
	_, again := c.completion(e.URL()+"/v1/completions", a)
	if got := again.Usage.PromptTokensDetails.CachedTokens; got >= (outA.Usage.PromptTokens-1)/16*16 {
		t.Fatalf("A still fully cached (%d tokens) after eviction", got)
	}
}
