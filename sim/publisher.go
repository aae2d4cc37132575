//go:build cgo

package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	zmq "github.com/pebbe/zmq4"
)

const haveZMQ = true

var errNoZMQ error

// replayPoll bounds how long the replay goroutine takes to notice Stop.
const replayPoll = 50 * time.Millisecond

// endSeq is vLLM's END_SEQ (-1 as 8 signed big-endian bytes) ending a replay.
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// garbageMessage is the GarbageEveryNBatches fault: three frames, a seq frame of the wrong size
// and a payload starting with 0xc1, a byte msgpack never uses.
var garbageSeq = []byte{0xde, 0xad, 0xbe}
var garbagePayload = []byte{0xc1, 'g', 'a', 'r', 'b', 'a', 'g', 'e', 0xc1, 0xff, 0x00}

// publisher is vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py): a PUB socket sending
// [topic, seq, payload] and an optional ROUTER answering replay requests from a buffer of
// recent batches. Each socket is used by exactly one goroutine (libzmq sockets are not thread
// safe), both owned by the engine's WaitGroup.
type publisher struct {
	e              *Engine
	zctx           *zmq.Context
	pub            *zmq.Socket
	router         *zmq.Socket
	pubEndpoint    string
	replayEndpoint string
	topic          []byte

	ringMu    sync.Mutex
	ring      []replayEntry // circular, grows up to cfg.ReplayBuffer
	ringStart int           // index of the oldest entry
}

type replayEntry struct {
	seq     uint64
	payload []byte // immutable once in the ring
}

// pubBinds follows vLLM: the PUB binds for wildcard, ipc and inproc endpoints and connects to
// anything else (llm-d style, where the subscriber binds).
func pubBinds(endpoint string) bool {
	return strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://")
}

// connectable turns a bound endpoint reported by libzmq into one a local client can dial.
func connectable(ep string) string {
	ep = strings.Replace(ep, "tcp://0.0.0.0:", "tcp://127.0.0.1:", 1)
	return strings.Replace(ep, "tcp://[::]:", "tcp://[::1]:", 1)
}

func startPublisher(e *Engine) (*publisher, error) {
	cfg := &e.cfg
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("cannot create zmq context: %w", err)
	}
	p := &publisher{e: e, zctx: zctx, topic: []byte(cfg.Topic)}
	fail := func(err error) (*publisher, error) {
		if p.pub != nil {
			_ = p.pub.Close()
		}
		if p.router != nil {
			_ = p.router.Close()
		}
		_ = zctx.Term()
		return nil, err
	}
	if p.pub, err = zctx.NewSocket(zmq.PUB); err != nil {
		return fail(fmt.Errorf("cannot create zmq PUB socket: %w", err))
	}
	_ = p.pub.SetLinger(0)
	_ = p.pub.SetSndhwm(100000) // vLLM's KVEventsConfig.hwm
	if pubBinds(cfg.KVEvents) {
		if err := p.pub.Bind(cfg.KVEvents); err != nil {
			return fail(fmt.Errorf("cannot bind kv events endpoint %q: %w", cfg.KVEvents, err))
		}
		ep, err := p.pub.GetLastEndpoint()
		if err != nil {
			return fail(fmt.Errorf("cannot read bound kv events endpoint: %w", err))
		}
		p.pubEndpoint = connectable(ep)
	} else {
		if err := p.pub.Connect(cfg.KVEvents); err != nil {
			return fail(fmt.Errorf("cannot connect kv events endpoint %q: %w", cfg.KVEvents, err))
		}
		p.pubEndpoint = cfg.KVEvents
	}
	if cfg.Replay != "" {
		if p.router, err = zctx.NewSocket(zmq.ROUTER); err != nil {
			return fail(fmt.Errorf("cannot create zmq ROUTER socket: %w", err))
		}
		_ = p.router.SetLinger(0)
		if err := p.router.Bind(cfg.Replay); err != nil {
			return fail(fmt.Errorf("cannot bind replay endpoint %q: %w", cfg.Replay, err))
		}
		ep, err := p.router.GetLastEndpoint()
		if err != nil {
			return fail(fmt.Errorf("cannot read bound replay endpoint: %w", err))
		}
		p.replayEndpoint = connectable(ep)
		p.ring = make([]replayEntry, 0, min(cfg.ReplayBuffer, 1024))
	}
	e.wg.Add(1)
	go p.publish()
	if p.router != nil {
		e.wg.Add(1)
		go p.serveReplay()
	}
	return p, nil
}

// close terminates the context once both goroutines have closed their sockets.
func (p *publisher) close() {
	_ = p.zctx.Term()
}

// publish sends one batch per engine step: it wakes on the first event of a step, lets the
// step's other events gather for BatchWindow, and sends them as one EventBatch.
func (p *publisher) publish() {
	e := p.e
	defer e.wg.Done()
	defer func() { _ = p.pub.Close() }()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var spare []byte
	var seq uint64
	frame := make([]byte, 0, 8)
	for {
		select {
		case <-e.stopCh:
			return
		case <-e.log.notify:
		}
		timer.Reset(e.cfg.BatchWindow)
		select {
		case <-e.stopCh:
			timer.Stop()
			return
		case <-timer.C:
		}
		e.mu.Lock()
		events, n, restart := e.log.take(spare)
		e.mu.Unlock()
		if restart {
			seq = 0
			p.ringMu.Lock()
			clear(p.ring)
			p.ring, p.ringStart = p.ring[:0], 0
			p.ringMu.Unlock()
		}
		if n == 0 {
			spare = events
			continue
		}
		ts := float64(time.Now().UnixNano()) / 1e9
		payload := appendBatch(make([]byte, 0, len(events)+16), e.log.format, ts, events, n, 0)
		spare = events
		faults := e.faults.Load()
		p.remember(seq, payload)
		frame = appendSeq(frame[:0], seq)
		seq++
		e.batches.Add(1)
		e.nextSeq.Store(seq)
		if faults.DropEveryNthBatch > 0 && seq%uint64(faults.DropEveryNthBatch) == 0 {
			e.dropped.Add(1) // the batch keeps its seq and stays replayable: a gap, like an HWM drop
		} else if err := p.send(p.pub, p.topic, frame, payload); err != nil {
			e.sendErrors.Add(1)
		}
		if faults.GarbageEveryNBatches > 0 && seq%uint64(faults.GarbageEveryNBatches) == 0 {
			if err := p.send(p.pub, p.topic, garbageSeq, garbagePayload); err != nil {
				e.sendErrors.Add(1)
			} else {
				e.garbage.Add(1)
			}
		}
	}
}

func (p *publisher) remember(seq uint64, payload []byte) {
	if p.router == nil {
		return
	}
	ent := replayEntry{seq: seq, payload: payload}
	p.ringMu.Lock()
	if len(p.ring) < p.e.cfg.ReplayBuffer {
		p.ring = append(p.ring, ent)
	} else {
		// vLLM keeps a deque of buffer_steps batches and drops the oldest.
		p.ring[p.ringStart] = ent
		p.ringStart = (p.ringStart + 1) % len(p.ring)
	}
	p.ringMu.Unlock()
}

// send sends frames as one multipart message.
func (p *publisher) send(s *zmq.Socket, frames ...[]byte) error {
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := s.SendBytes(f, flag); err != nil {
			return err
		}
	}
	return nil
}

// serveReplay answers replay requests: the ROUTER receives [identity, "", start seq (big
// endian)] and sends every buffered batch with seq >= start, then the end marker. Layouts
// (vllm/distributed/kv_events.py; the new one since vllm-project/vllm#45177): new [identity,
// "", topic, seq, payload] … [identity, "", "", END, ""]; old [identity, "", seq, payload] …
// [identity, "", END, ""]. Other requests are ignored, as vLLM logs and ignores them.
func (p *publisher) serveReplay() {
	e := p.e
	defer e.wg.Done()
	defer func() { _ = p.router.Close() }()
	poller := zmq.NewPoller()
	poller.Add(p.router, zmq.POLLIN)
	var batch []replayEntry
	seqFrame := make([]byte, 8)
	for !e.stopped() {
		polled, err := poller.Poll(replayPoll)
		if err != nil {
			if errors.Is(err, zmq.ETERM) {
				return
			}
			time.Sleep(replayPoll) // e.g. EINTR with retries off; try again
			continue
		}
		if len(polled) == 0 {
			continue
		}
		msg, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil || len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) == 0 || len(msg[2]) > 8 {
			continue
		}
		var start uint64
		for _, b := range msg[2] {
			start = start<<8 | uint64(b)
		}
		batch = p.snapshot(batch[:0], start)
		id := msg[0]
		for _, ent := range batch {
			binary.BigEndian.PutUint64(seqFrame, ent.seq)
			if e.cfg.ReplayLayout == ReplayNew {
				err = p.send(p.router, id, nil, p.topic, seqFrame, ent.payload)
			} else {
				err = p.send(p.router, id, nil, seqFrame, ent.payload)
			}
			if err != nil {
				e.sendErrors.Add(1)
				break
			}
		}
		clear(batch)
		if e.cfg.ReplayLayout == ReplayNew {
			err = p.send(p.router, id, nil, nil, endSeq, nil)
		} else {
			err = p.send(p.router, id, nil, endSeq, nil)
		}
		if err != nil {
			e.sendErrors.Add(1)
		}
	}
}

// snapshot appends the buffered batches with seq >= start to dst.
func (p *publisher) snapshot(dst []replayEntry, start uint64) []replayEntry {
	p.ringMu.Lock()
	defer p.ringMu.Unlock()
	for i := range p.ring {
		ent := p.ring[(p.ringStart+i)%len(p.ring)]
		if ent.seq >= start {
			dst = append(dst, ent)
		}
	}
	return dst
}
