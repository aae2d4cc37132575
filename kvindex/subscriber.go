//go:build cgo

package kvindex

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Socket tuning. The receive timeout bounds how long Stop waits for a goroutine blocked in Recv
// (libzmq offers no other way to interrupt it short of terminating the context; research/libraries.md
// section 4).
const (
	recvTimeout     = 250 * time.Millisecond
	rcvHWM          = 100_000 // vLLM's PUB default hwm
	heartbeatIvl    = 5 * time.Second
	heartbeatTTL    = 15 * time.Second
	reconnectIvl    = 100 * time.Millisecond
	reconnectIvlMax = 5 * time.Second
	reopenDelayMin  = 100 * time.Millisecond
	reopenDelayMax  = 10 * time.Second
	// defaultReplayTimeout bounds one replay request, from send to the end marker.
	defaultReplayTimeout = 5 * time.Second
)

// endSeq is the sequence of the replay end marker (-1 as signed 8-byte big-endian).
const endSeq = 0xffff_ffff_ffff_ffff

// Subscriber receives vLLM KV events over ZMQ for several targets of one Index: one goroutine per target,
// each owning its own SUB socket (and, for replay, a short-lived DEALER socket) created from one zmq
// context; sockets never cross goroutines (libzmq sockets are not thread-safe).
//
// All methods are safe for concurrent use.
type Subscriber struct {
	ix   *Index
	log  *slog.Logger
	zctx *zmq.Context

	replayTimeout time.Duration

	mu      sync.Mutex
	workers map[int]*worker
	ctx     context.Context // set by Start
	cancel  context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

type worker struct {
	s      *Subscriber
	target int
	cfg    SubscriberConfig
	st     *Stream
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// NewSubscriber returns a Subscriber feeding ix. logger may be nil (slog.Default()).
func NewSubscriber(ix *Index, logger *slog.Logger) (*Subscriber, error) {
	zctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("cannot create zmq context: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	return &Subscriber{
		ix:            ix,
		log:           logger,
		zctx:          zctx,
		replayTimeout: defaultReplayTimeout,
		workers:       make(map[int]*worker),
	}, nil
}

// Add subscribes target t with cfg and returns its Stream (for Trusted and Stats). The target's goroutine
// starts now if the Subscriber is running, else at Start.
func (s *Subscriber) Add(t int, cfg SubscriberConfig) (*Stream, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cannot add kv events subscription for target %d: %w", t, err)
	}
	if t < 0 || t >= s.ix.MaxTargets() {
		return nil, fmt.Errorf("cannot add kv events subscription: target %d out of range 0..%d", t, s.ix.MaxTargets()-1)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, errors.New("cannot add kv events subscription: subscriber stopped")
	}
	if _, ok := s.workers[t]; ok {
		return nil, fmt.Errorf("cannot add kv events subscription: target %d already subscribed", t)
	}
	w := &worker{s: s, target: t, cfg: cfg}
	var rp Replayer
	if cfg.ReplayEndpoint != "" {
		rp = &zmqReplayer{w: w}
	}
	w.st = NewStream(s.ix.Target(t, cfg.MaxBlocks), StreamConfig{StaleAfter: cfg.StaleAfter, Replayer: rp})
	s.workers[t] = w
	if s.ctx != nil {
		s.launch(w)
	}
	return w.st, nil
}

// Stream returns the Stream of target t, or nil.
func (s *Subscriber) Stream(t int) *Stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.workers[t]; w != nil {
		return w.st
	}
	return nil
}

// Start starts the goroutines of every added target; they run until ctx is done or Stop.
func (s *Subscriber) Start(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx != nil || s.stopped {
		return
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	for _, w := range s.workers {
		s.launch(w)
	}
}

// launch starts w's goroutine. Called with s.mu held.
func (s *Subscriber) launch(w *worker) {
	ctx, cancel := context.WithCancel(s.ctx)
	w.ctx, w.cancel = ctx, cancel
	w.done = make(chan struct{})
	s.wg.Add(1)
	go w.run(ctx)
}

// Remove stops target t's goroutine, waits for it and clears the target's index.
func (s *Subscriber) Remove(t int) {
	s.mu.Lock()
	w := s.workers[t]
	delete(s.workers, t)
	s.mu.Unlock()
	if w == nil {
		return
	}
	if w.cancel != nil {
		w.cancel()
		<-w.done
	}
	// The goroutine is gone, so this goroutine is now the target's only writer.
	w.st.ti.Clear()
}

// Stop stops every goroutine, waits for them and releases the zmq context. The Subscriber cannot be
// restarted.
func (s *Subscriber) Stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
	// Every socket is closed by its goroutine, so Term does not block.
	if err := s.zctx.Term(); err != nil {
		s.log.Warn("cannot terminate zmq context", "err", err)
	}
}

func (w *worker) logArgs(args ...any) []any {
	return append([]any{"target", w.target, "endpoint", w.cfg.Endpoint, "mode", w.mode()}, args...)
}

func (w *worker) mode() string {
	if w.cfg.Mode == "" {
		return "connect"
	}
	return w.cfg.Mode
}

func (w *worker) run(ctx context.Context) {
	defer w.s.wg.Done()
	defer close(w.done)
	delay := reopenDelayMin
	for ctx.Err() == nil {
		received, err := w.session(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if received {
			delay = reopenDelayMin
		}
		w.s.log.Warn("kv events subscription failed; reopening", w.logArgs("err", err, "retry_in", delay)...)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, reopenDelayMax)
	}
}

// session opens the SUB socket and handles messages until ctx is done (nil) or the socket fails.
func (w *worker) session(ctx context.Context) (received bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
			w.st.fail()
		}
	}()
	sock, err := w.s.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return false, fmt.Errorf("cannot create SUB socket: %w", err)
	}
	defer sock.Close()
	if err := w.configure(sock); err != nil {
		return false, err
	}
	for {
		if ctx.Err() != nil {
			return received, nil
		}
		frames, err := sock.RecvMessageBytes(0)
		now := time.Now()
		if err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				w.st.Tick(now)
				continue
			case zmq.ETERM:
				return received, nil
			}
			return received, fmt.Errorf("cannot receive: %w", err)
		}
		received = true
		w.st.HandleFrames(frames, now)
		w.st.Tick(now)
	}
}

func (w *worker) configure(sock *zmq.Socket) error {
	set := func(name string, err error) error {
		if err != nil {
			return fmt.Errorf("cannot set %s: %w", name, err)
		}
		return nil
	}
	// Linger 0: a closing socket must not hold Term back.
	if err := set("linger", sock.SetLinger(0)); err != nil {
		return err
	}
	// vLLM's PUB drops at its hwm too; a high SUB hwm keeps drops on the publisher side, where the
	// sequence numbers reveal them.
	if err := set("rcvhwm", sock.SetRcvhwm(rcvHWM)); err != nil {
		return err
	}
	if err := set("rcvtimeo", sock.SetRcvtimeo(recvTimeout)); err != nil {
		return err
	}
	if err := set("reconnect_ivl", sock.SetReconnectIvl(reconnectIvl)); err != nil {
		return err
	}
	if err := set("reconnect_ivl_max", sock.SetReconnectIvlMax(reconnectIvlMax)); err != nil {
		return err
	}
	// ZMTP heartbeats catch half-open TCP connections (a silently dead engine host), which would
	// otherwise look like an idle publisher forever.
	if err := set("heartbeat_ivl", sock.SetHeartbeatIvl(heartbeatIvl)); err != nil {
		return err
	}
	if err := set("heartbeat_timeout", sock.SetHeartbeatTimeout(heartbeatTTL)); err != nil {
		return err
	}
	if err := set("subscribe", sock.SetSubscribe(w.cfg.Topic)); err != nil {
		return err
	}
	if w.cfg.Mode == "bind" {
		if err := sock.Bind(w.cfg.Endpoint); err != nil {
			return fmt.Errorf("cannot bind SUB to %q: %w", w.cfg.Endpoint, err)
		}
		return nil
	}
	if err := sock.Connect(w.cfg.Endpoint); err != nil {
		return fmt.Errorf("cannot connect SUB to %q: %w", w.cfg.Endpoint, err)
	}
	return nil
}

// zmqReplayer asks the engine's ROUTER for buffered batches through a DEALER socket created, used and
// closed by the worker goroutine that calls Replay (from inside Stream.Handle).
type zmqReplayer struct {
	w *worker
}

// Replay implements Replayer: it sends ["", start as 8-byte big-endian] and reads replies until the end
// marker, accepting both layouts (research/vllm-wire.md section 1.3): ["", seq, payload] before
// vllm-project/vllm#45177 and ["", topic, seq, payload] since.
func (r *zmqReplayer) Replay(start uint64, fn func(seq uint64, payload []byte)) error {
	w := r.w
	err := w.replay(start, fn)
	if err != nil {
		w.s.log.Warn("kv events replay failed", w.logArgs("replay_endpoint", w.cfg.ReplayEndpoint, "start_seq", start, "err", err)...)
	}
	return err
}

func (w *worker) replay(start uint64, fn func(seq uint64, payload []byte)) error {
	sock, err := w.s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return fmt.Errorf("cannot create DEALER socket: %w", err)
	}
	defer sock.Close()
	if err := sock.SetLinger(0); err != nil {
		return fmt.Errorf("cannot set linger: %w", err)
	}
	if err := sock.SetRcvtimeo(recvTimeout); err != nil {
		return fmt.Errorf("cannot set rcvtimeo: %w", err)
	}
	if err := sock.SetSndtimeo(w.s.replayTimeout); err != nil {
		return fmt.Errorf("cannot set sndtimeo: %w", err)
	}
	if err := sock.Connect(w.cfg.ReplayEndpoint); err != nil {
		return fmt.Errorf("cannot connect DEALER to %q: %w", w.cfg.ReplayEndpoint, err)
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], start)
	if _, err := sock.SendBytes(nil, zmq.SNDMORE); err != nil {
		return fmt.Errorf("cannot send replay request: %w", err)
	}
	if _, err := sock.SendBytes(seqb[:], 0); err != nil {
		return fmt.Errorf("cannot send replay request: %w", err)
	}
	deadline := time.Now().Add(w.s.replayTimeout)
	for {
		if w.ctx.Err() != nil {
			return errors.New("subscription stopping")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no end marker within %s", w.s.replayTimeout)
		}
		frames, err := sock.RecvMessageBytes(0)
		if err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				continue
			}
			return fmt.Errorf("cannot receive replay: %w", err)
		}
		// Drop the DEALER's empty delimiter; a sequence frame is never empty.
		if len(frames) > 0 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		var seqf, payload []byte
		switch len(frames) {
		case 2:
			seqf, payload = frames[0], frames[1]
		case 3:
			seqf, payload = frames[1], frames[2]
		default:
			return fmt.Errorf("cannot parse replay reply: %d frames", len(frames))
		}
		if len(seqf) != 8 {
			return fmt.Errorf("cannot parse replay reply: sequence frame of %d bytes", len(seqf))
		}
		seq := binary.BigEndian.Uint64(seqf)
		if seq == endSeq {
			return nil
		}
		fn(seq, payload)
	}
}
