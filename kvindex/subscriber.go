//go:build cgo

package kvindex

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// Supported reports whether this build can subscribe to KV events: pebbe/zmq4 needs cgo and libzmq.
const Supported = true

// curveAvailable reports whether libzmq can do CURVE (it needs libsodium or its own tweetnacl).
func curveAvailable() bool { return zmq.HasCurve() }

// Socket tuning. The receive timeout bounds how long Stop waits for a goroutine blocked in Recv
// (libzmq offers no other way to interrupt it short of terminating the context, which waits for every
// socket to close; docs/internals/zmq.md).
const (
	recvTimeout = 250 * time.Millisecond
	// rcvHWM is libzmq's queue in front of the target's msgQueue, in messages: libzmq cannot bound it in
	// bytes, so it is kept short and the reader drains it continuously into the byte-bounded msgQueue.
	// While the reader is descheduled it holds at most rcvHWM+1 messages of MaxMessageBytes; then TCP
	// pushes back and the publisher buffers (vLLM's PUB holds 100,000 batches per subscriber and drops
	// beyond, which the sequence reveals). BenchmarkSubscriber on 2 cores, publisher included: 16 gives
	// ~50k realistic batches/s, 4 gives 30k, 1,000 gives 67k (and a 17 GB worst case); vLLM sends hundreds.
	rcvHWM          = 16
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

// Subscriber receives vLLM KV events over ZMQ for several targets of one Index. Each target has an
// applier goroutine that owns its Stream (and, for replay, a short-lived DEALER socket) and applies the
// batches queued for it, so that a replay or a large batch never stalls a socket. Each SUB socket has a
// reader goroutine (with the socket's monitor) that does nothing but drain it into the bounded msgQueue of
// the target each message's topic names. A connect-mode target has a socket of its own; bind-mode targets
// that name the same endpoint with the same socket settings share one socket, told apart by topic (llm-d
// style: every engine connects to one subscriber; doc.go, "One bind endpoint for many engines"). Sockets
// come from one zmq context and never cross goroutines (libzmq sockets are not thread-safe). When a
// bind-mode socket has a publisher policy (SubscriberConfig.AllowedPublishers, CURVE), one more goroutine
// answers libzmq's ZAP requests for the whole context (zapHandler); it starts with the first such socket
// and stops last.
//
// All methods are safe for concurrent use.
type Subscriber struct {
	ix   *Index
	log  *slog.Logger
	zctx *zmq.Context
	auth *authorizer
	zap  *zapHandler // started by launchReader, under mu

	replayTimeout time.Duration
	queueMessages int           // maxQueuedMessages; tests lower it
	monitors      atomic.Uint64 // numbers the sockets' monitor endpoints

	mu      sync.Mutex
	workers map[int]*worker
	readers map[*reader]struct{} // every socket with a target attached
	// released are the bind endpoints of sockets closed lately, and when: libzmq lets the address go
	// a moment after the socket closes, and a bind there meanwhile is this subscriber's own retry, not
	// another listener's address.
	released map[string]time.Time
	ctx      context.Context // set by Start
	cancel   context.CancelFunc
	stopped  bool
	wg       sync.WaitGroup
}

// worker is one target: its Stream, the queue its reader fills, and the applier goroutine.
type worker struct {
	s      *Subscriber
	target int
	cfg    SubscriberConfig
	st     *Stream
	q      *msgQueue // from the reader to the applier
	rd     *reader   // the socket it is attached to, for its whole life
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// reader is one SUB socket, its goroutine and the targets attached to it.
type reader struct {
	s *Subscriber
	// cfg holds the socket's settings (Endpoint, Mode, MaxMessageBytes and the publisher policy); its
	// Topic is not used: the socket subscribes to every attached target's topic.
	cfg SubscriberConfig
	// shared: a bind-mode socket that other targets with the same settings join.
	shared bool
	// policy is the socket's publisher policy (bind mode), nil without one.
	policy *authPolicy
	// retry wakes the goroutine from its wait before reopening: another socket on the same endpoint
	// closed, so a bind that failed with "address already in use" may succeed now.
	retry chan struct{}

	mu       sync.Mutex
	attached []*worker // replaced, never changed in place: the goroutine keeps a snapshot
	// gen counts the changes of attached; applied is the last one the goroutine took in (its topics
	// subscribed, its messages dispatched by it).
	gen, applied atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	// Owned by the goroutine: failed handshakes whose disconnect event has not been seen yet
	// (checkMonitor), and the limit on the refusals' log lines.
	refusedPending uint64
	refusedLog     logLimiter
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
	auth := newAuthorizer(logger)
	return &Subscriber{
		ix:            ix,
		log:           logger,
		zctx:          zctx,
		auth:          auth,
		zap:           &zapHandler{auth: auth, zctx: zctx, log: logger},
		replayTimeout: defaultReplayTimeout,
		queueMessages: maxQueuedMessages,
		workers:       make(map[int]*worker),
		readers:       make(map[*reader]struct{}),
		released:      make(map[string]time.Time),
	}, nil
}

// Add subscribes target t with cfg and returns its Stream (for Trust and Stats). A bind-mode target joins
// the socket already bound to cfg.Endpoint when its socket settings are the same (SameSocket), and
// receives the messages whose topic cfg.Topic is the longest prefix of among the socket's targets (every
// target with that topic, when several have it: a reload that replaces a provider's subscription keeps
// the old one fed until it is removed). Otherwise it gets a socket of its own; one that binds an address
// another socket holds retries until that one closes. The target's goroutines start now if the Subscriber
// is running, else at Start.
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
	w := &worker{s: s, target: t, cfg: cfg, q: newMsgQueue(cfg.maxQueueBytes(), s.queueMessages)}
	rd := s.sharedReader(&cfg)
	fresh := rd == nil
	if fresh && cfg.Mode == "bind" && !s.holdsEndpoint(cfg.Endpoint) {
		if err := bindable(cfg.Endpoint); err != nil {
			return nil, fmt.Errorf("cannot add kv events subscription for target %d: %w", t, err)
		}
	}
	if fresh {
		rd = &reader{s: s, cfg: cfg, shared: cfg.Mode == "bind", retry: make(chan struct{}, 1)}
		rd.cfg.Topic = ""
		if cfg.hasPolicy() {
			policy, err := newAuthPolicy(s.auth.domain(), &cfg)
			if err != nil {
				return nil, fmt.Errorf("cannot add kv events subscription for target %d: %w", t, err)
			}
			rd.policy = policy
			s.auth.add(policy)
		}
		s.readers[rd] = struct{}{}
	}
	var rp Replayer
	if cfg.ReplayEndpoint != "" {
		rp = &zmqReplayer{w: w}
	}
	w.st = NewStream(s.ix.Target(t, cfg.MaxBlocks), StreamConfig{StaleAfter: cfg.StaleAfter, Replayer: rp})
	w.rd = rd
	rd.attach(w)
	s.workers[t] = w
	if s.ctx != nil {
		s.launchWorker(w)
		if fresh {
			s.launchReader(rd)
		}
	}
	return w.st, nil
}

// holdsEndpoint reports whether one of the subscriber's sockets has endpoint, or had it until lately
// (releaseWindow): a bind there that fails because that socket holds the address is retried until it
// closes. Called with s.mu held.
func (s *Subscriber) holdsEndpoint(endpoint string) bool {
	now := time.Now()
	for e, at := range s.released {
		if now.Sub(at) > releaseWindow {
			delete(s.released, e)
		}
	}
	if _, ok := s.released[endpoint]; ok {
		return true
	}
	for rd := range s.readers {
		if rd.cfg.Endpoint == endpoint {
			return true
		}
	}
	return false
}

// releaseWindow is how long a closed socket's bind endpoint counts as the subscriber's own: libzmq's I/O
// thread lets the address go after the socket's close returns.
const releaseWindow = 5 * time.Second

// bindable refuses a tcp:// bind endpoint whose address another process (or another listener of this
// one) holds: the socket would retry its bind forever, and the subscription would never receive. It binds
// the address itself and lets it go. Endpoints it cannot map to a TCP address (an interface name, port *)
// are left to libzmq.
func bindable(endpoint string) error {
	hostport, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return nil
	}
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || port == "*" || port == "0" {
		return nil
	}
	if host == "*" {
		host = ""
	} else if _, err := netip.ParseAddr(host); host != "" && err != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("cannot bind %q: the address is in use", endpoint)
	}
	if err == nil {
		_ = ln.Close()
	}
	return nil
}

// sharedReader returns the live bind-mode socket cfg can join, or nil. Called with s.mu held.
func (s *Subscriber) sharedReader(cfg *SubscriberConfig) *reader {
	if cfg.Mode != "bind" {
		return nil
	}
	for rd := range s.readers {
		if rd.shared && SameSocket(&rd.cfg, cfg) {
			return rd
		}
	}
	return nil
}

// attach adds w to the socket's targets; the goroutine subscribes its topic at its next message or idle
// turn.
func (rd *reader) attach(w *worker) {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.attached = append(slices.Clip(rd.attached), w)
	rd.gen.Add(1)
}

// detach removes w and returns how many targets are left.
func (rd *reader) detach(w *worker) int {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	rd.attached = slices.DeleteFunc(slices.Clone(rd.attached), func(x *worker) bool { return x == w })
	rd.gen.Add(1)
	return len(rd.attached)
}

// targets returns the socket's targets; the slice is never changed afterwards.
func (rd *reader) targets() []*worker {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	return rd.attached
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

// Config returns the settings target t was subscribed with (as Add received them), and whether it is
// subscribed: what the subscription runs on, whatever its caller holds.
func (s *Subscriber) Config(t int) (SubscriberConfig, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.workers[t]; w != nil {
		return w.cfg, true
	}
	return SubscriberConfig{}, false
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
		s.launchWorker(w)
	}
	for rd := range s.readers {
		s.launchReader(rd)
	}
}

// launchWorker starts w's applier goroutine. Called with s.mu held.
func (s *Subscriber) launchWorker(w *worker) {
	w.ctx, w.cancel = context.WithCancel(s.ctx)
	w.done = make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(w.done)
		w.apply(w.ctx)
	}()
}

// launchReader starts rd's goroutine, and first the ZAP handler if rd is the first socket with a policy.
// Called with s.mu held.
func (s *Subscriber) launchReader(rd *reader) {
	if rd.policy != nil && !s.zap.started {
		s.zap.started = true
		// On failure the handler stays down and the socket's session refuses to bind (session).
		if s.zap.err = s.zap.start(); s.zap.err != nil {
			s.log.Error("cannot start the ZAP handler; kv events targets with allowed_publishers or curve keys stay closed", "err", s.zap.err)
		}
	}
	rd.ctx, rd.cancel = context.WithCancel(s.ctx)
	rd.done = make(chan struct{})
	s.wg.Add(1)
	go rd.run(rd.ctx)
}

// Remove stops target t's goroutine, waits for it and clears the target's index. Its socket is closed
// when no other target shares it; the others on a shared socket go on receiving without a pause.
func (s *Subscriber) Remove(t int) {
	s.mu.Lock()
	w := s.workers[t]
	delete(s.workers, t)
	var last *reader
	if w != nil && w.rd.detach(w) == 0 {
		last = w.rd
		delete(s.readers, last)
	}
	s.mu.Unlock()
	if w == nil {
		return
	}
	if last != nil {
		if last.cancel != nil {
			last.cancel()
			<-last.done
		}
		if last.cfg.Mode == "bind" {
			s.mu.Lock()
			s.released[last.cfg.Endpoint] = time.Now()
			s.mu.Unlock()
		}
		if last.policy != nil {
			// Its socket is closed: no request can name the domain any more.
			s.auth.remove(last.policy.domain)
		}
		s.kick(last.cfg.Endpoint)
	}
	if w.cancel != nil {
		w.cancel()
		<-w.done
	}
	// The goroutine is gone, so this goroutine is now the target's only writer.
	w.st.ti.Clear()
}

// kick wakes the sockets waiting to reopen on endpoint: the address is free now.
func (s *Subscriber) kick(endpoint string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for rd := range s.readers {
		if rd.cfg.Endpoint == endpoint {
			select {
			case rd.retry <- struct{}{}:
			default:
			}
		}
	}
}

// AuthErrors returns how many ZAP requests the handler could not attribute to a socket: malformed ones
// (answered 500) and ones naming no known domain (answered 400). libzmq sends neither; a non-zero value is
// a bug or something else in the process speaking to the handler. Refused publishers are counted per
// target (StreamStats.AuthRefused).
func (s *Subscriber) AuthErrors() uint64 {
	return s.auth.errors.Load()
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
	// The ZAP handler last: until every socket is closed, a handler that went away would let any peer in
	// (zapHandler). No launch can start it any more (stopped is set). Terminating the context wakes its
	// Recv with ETERM at once; Term returns when it has closed its socket, every other socket being closed
	// already by its goroutine.
	s.zap.cancelRun()
	if err := s.zctx.Term(); err != nil {
		s.log.Warn("cannot terminate zmq context", "err", err)
	}
	s.zap.wait()
}

func (w *worker) logArgs(args ...any) []any {
	return append([]any{"target", w.target, "endpoint", w.cfg.Endpoint, "topic", w.cfg.Topic, "mode", mode(&w.cfg)}, args...)
}

func (rd *reader) logArgs(args ...any) []any {
	ws := rd.targets()
	ts := make([]int, len(ws))
	for i, w := range ws {
		ts[i] = w.target
	}
	return append([]any{"targets", ts, "endpoint", rd.cfg.Endpoint, "mode", mode(&rd.cfg)}, args...)
}

func mode(c *SubscriberConfig) string {
	if c.Mode == "" {
		return "connect"
	}
	return c.Mode
}

// run is the socket's goroutine: it opens the socket and reopens it after a failure, until ctx is done.
func (rd *reader) run(ctx context.Context) {
	defer rd.s.wg.Done()
	defer close(rd.done)
	delay := reopenDelayMin
	for ctx.Err() == nil {
		received, err := rd.session(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		if received {
			delay = reopenDelayMin
		}
		rd.s.log.Warn("kv events subscription failed; reopening", rd.logArgs("err", err, "retry_in", delay)...)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-rd.retry:
			t.Stop()
		case <-t.C:
		}
		delay = min(2*delay, reopenDelayMax)
	}
}

// monitorEvery is how many messages the reader receives between two looks at the socket monitor (it also
// looks whenever the socket is idle for recvTimeout).
const monitorEvery = 64

// session opens the SUB socket and queues messages until ctx is done (nil) or the socket fails or, in
// connect mode, loses its publisher.
func (rd *reader) session(ctx context.Context) (received bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	sock, err := rd.s.zctx.NewSocket(zmq.SUB)
	if err != nil {
		return false, fmt.Errorf("cannot create SUB socket: %w", err)
	}
	var mon *zmq.Socket
	defer func() {
		// The SUB first: closing it stops its monitor, which must still have a peer to send to.
		_ = sock.Close()
		if mon != nil {
			_ = mon.Close()
		}
	}()
	if mon, err = rd.monitor(sock); err != nil {
		return false, err
	}
	rd.refusedPending = 0
	if err := rd.configure(sock); err != nil {
		return false, err
	}
	subscribed := map[string]bool{}
	var ws []*worker
	gen := rd.gen.Load() - 1 // anything but the current generation: subscribe at once
	for n := 0; ; n++ {
		if ctx.Err() != nil {
			return received, nil
		}
		if g := rd.gen.Load(); g != gen {
			gen, ws = g, rd.targets()
			if err := subscribeTopics(sock, ws, subscribed); err != nil {
				return received, err
			}
			rd.applied.Store(g)
		}
		topic, seq, payload, ok, err := recvBatch(sock)
		if err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				if err := rd.checkMonitor(mon, ws); err != nil {
					return received, err
				}
				continue
			case zmq.ETERM:
				return received, nil
			}
			return received, fmt.Errorf("cannot receive: %w", err)
		}
		received = true
		dispatch(ws, topic, seq, payload, ok)
		if n%monitorEvery == 0 {
			if err := rd.checkMonitor(mon, ws); err != nil {
				return received, err
			}
		}
	}
}

// subscribeTopics makes the socket's subscriptions the topics of ws; subscribed holds the socket's
// current ones and is updated. libzmq counts subscriptions, so each topic is subscribed once however many
// targets have it.
func subscribeTopics(sock *zmq.Socket, ws []*worker, subscribed map[string]bool) error {
	want := make(map[string]bool, len(ws))
	for _, w := range ws {
		want[w.cfg.Topic] = true
	}
	for topic := range want {
		if !subscribed[topic] {
			if err := sock.SetSubscribe(topic); err != nil {
				return fmt.Errorf("cannot subscribe to topic %q: %w", topic, err)
			}
			subscribed[topic] = true
		}
	}
	for topic := range subscribed {
		if !want[topic] {
			if err := sock.SetUnsubscribe(topic); err != nil {
				return fmt.Errorf("cannot unsubscribe from topic %q: %w", topic, err)
			}
			delete(subscribed, topic)
		}
	}
	return nil
}

// dispatch queues one message for the targets of ws whose topic is the longest prefix of its topic (the
// SUB's own filter is a prefix match; the longest one tells "kv@10.0.0.1" from "kv@10.0.0.11"). A message
// no target's topic matches (one still in flight for a target just removed) is dropped. ok false marks a
// message without the [topic, seq, payload] shape: counted as garbage by the targets it names. Several
// targets with the same topic (a reload replacing a subscription) share the payload: appliers only read
// it.
func dispatch(ws []*worker, topic []byte, seq uint64, payload []byte, ok bool) {
	best := -1
	for _, w := range ws {
		if l := len(w.cfg.Topic); l > best && hasTopic(topic, w.cfg.Topic) {
			best = l
		}
	}
	if best < 0 {
		return
	}
	now := time.Now()
	for _, w := range ws {
		if len(w.cfg.Topic) != best || !hasTopic(topic, w.cfg.Topic) {
			continue
		}
		switch {
		case !ok:
			w.st.garbage()
		case !w.q.push(seq, payload, now):
			w.st.c.queueDrops.Add(1)
		}
	}
}

// hasTopic reports whether a message's topic frame starts with a subscription's topic, as the SUB's
// filter matches.
func hasTopic(frame []byte, topic string) bool {
	return len(frame) >= len(topic) && string(frame[:len(topic)]) == topic
}

// recvBatch receives one message and returns its topic, sequence and payload; ok is false for a message
// without the [topic, 8-byte sequence, payload] shape (its topic is still its first frame).
func recvBatch(sock *zmq.Socket) (topic []byte, seq uint64, payload []byte, ok bool, err error) {
	var parts [3][]byte
	n, err := recvParts(sock, parts[:])
	if err != nil || n != 3 || len(parts[1]) != 8 {
		return parts[0], 0, nil, false, err
	}
	return parts[0], binary.BigEndian.Uint64(parts[1]), parts[2], true, nil
}

// recvParts receives one message frame by frame into dst and returns its number of frames; frames past
// len(dst) are dropped as they arrive. RecvMessageBytes would copy every frame into Go memory first, and a
// message may have any number of frames, each up to MaxMessageBytes (libzmq itself buffers the whole
// message before its first frame is readable; see doc.go).
func recvParts(sock *zmq.Socket, dst [][]byte) (int, error) {
	for n := 0; ; n++ {
		f, err := sock.RecvBytes(0)
		if err != nil {
			return n, err
		}
		if n < len(dst) {
			dst[n] = f
		}
		more, err := sock.GetRcvmore()
		if err != nil {
			return n + 1, err
		}
		if !more {
			return n + 1, nil
		}
	}
}

// monitor attaches a monitor to sock that reports closed connections (and, with a publisher policy,
// refused handshakes), and returns the PAIR socket that reads it. Its queue is unbounded (rcvhwm 0):
// libzmq's I/O thread blocks when a monitor's queue is full, which would stall every socket of the
// context; the reader drains it every monitorEvery messages and whenever the socket is idle, and only a
// closed connection adds to it (a refused one adds two events).
func (rd *reader) monitor(sock *zmq.Socket) (*zmq.Socket, error) {
	addr := fmt.Sprintf("inproc://kvindex-monitor-%d", rd.s.monitors.Add(1))
	events := zmq.EVENT_DISCONNECTED
	if rd.policy != nil {
		events |= zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
	}
	if err := sock.Monitor(addr, events); err != nil {
		return nil, fmt.Errorf("cannot monitor SUB socket: %w", err)
	}
	mon, err := rd.s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return nil, fmt.Errorf("cannot create monitor socket: %w", err)
	}
	if err := mon.SetLinger(0); err != nil {
		_ = mon.Close()
		return nil, fmt.Errorf("cannot set monitor linger: %w", err)
	}
	if err := mon.SetRcvhwm(0); err != nil {
		_ = mon.Close()
		return nil, fmt.Errorf("cannot set monitor rcvhwm: %w", err)
	}
	if err := mon.Connect(addr); err != nil {
		_ = mon.Close()
		return nil, fmt.Errorf("cannot connect monitor to %q: %w", addr, err)
	}
	return mon, nil
}

// checkMonitor counts the publisher connections closed since the last look, in every target of ws: a
// socket does not know which of its publishers (on a shared socket, which target) a connection carried.
// In connect mode it returns an error when one was: libzmq reconnects after a connection error but not
// after a protocol error, and a frame over ZMQ_MAXMSGSIZE is one (session_base_t::engine_error, libzmq
// 4.3), so the socket would stay connected to nothing for good. The session ends and run reopens it. In
// bind mode the publisher reconnects by itself.
//
// With a publisher policy it also counts refused connections, every handshake that failed:
// HANDSHAKE_FAILED_AUTH (the ZAP handler said no), HANDSHAKE_FAILED_PROTOCOL (the CURVE handshake failed
// before asking it: a NULL peer where CURVE is required, a wrong server key) and
// HANDSHAKE_FAILED_NO_DETAIL (the connection broke during the handshake). The last one is needed: which
// side of a NULL/CURVE mismatch notices it first is a race, and when the publisher does, it hangs up and
// the gateway sees only a broken connection (EPIPE; measured over ipc with libzmq 4.3.4). A peer that
// does not speak ZMTP 3 gets none of these, only DISCONNECTED. libzmq follows each failed handshake with
// the connection's DISCONNECTED (stream_engine_base_t::error), which is not a publisher lost: as many
// DISCONNECTED as failed handshakes are left out of Disconnects. Events of different connections may
// interleave, but the totals are exact.
func (rd *reader) checkMonitor(mon *zmq.Socket, ws []*worker) error {
	lost := 0
	for {
		ev, _, val, err := mon.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			break
		}
		switch ev {
		case zmq.EVENT_DISCONNECTED:
			if rd.refusedPending > 0 {
				rd.refusedPending--
			} else {
				lost++
			}
		case zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
			rd.refusedPending++
			for _, w := range ws {
				w.st.c.authRefused.Add(1)
			}
			if ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH {
				continue // logged by the ZAP handler, with the peer's address
			}
			if ok, suppressed := rd.refusedLog.allow(time.Now()); ok {
				rd.s.log.Warn("kv events publisher refused: handshake failed", rd.logArgs("reason", handshakeFailure(ev, val),
					"refused_before_unlogged", suppressed)...)
			}
		}
	}
	if lost == 0 {
		return nil
	}
	for _, w := range ws {
		w.st.c.disconnects.Add(uint64(lost))
	}
	if mode(&rd.cfg) == "connect" {
		return errors.New("publisher disconnected (it went away, heartbeats timed out, or it sent a frame over max_message_bytes)")
	}
	return nil
}

// apply is the target's applier goroutine, the Stream's only writer: it applies the queued batches in
// order and ticks the stream for staleness.
func (w *worker) apply(ctx context.Context) {
	q := w.q
	tick := time.NewTicker(recvTimeout)
	defer tick.Stop()
	var items []queued
	pos := 0
	for ctx.Err() == nil {
		if pos == len(items) {
			if cap(items) > 4096 {
				// Let a burst's queue go instead of keeping its slots for good.
				items = nil
			}
			items, pos = q.take(items), 0
		}
		if pos < len(items) {
			pos = w.applyItems(q, items, pos)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-q.signal:
		case <-tick.C:
		}
		w.st.Tick(time.Now())
	}
}

// applyItems applies items[pos:] and returns len(items). A panic (a bug) is logged, resets the stream
// (Stream.fail: its state is unknown) and ends the call with the position after the item that panicked.
func (w *worker) applyItems(q *msgQueue, items []queued, pos int) (next int) {
	defer func() {
		if r := recover(); r != nil {
			w.s.log.Error("BUG: kv events batch panicked; target reset", w.logArgs("panic", r, "stack", string(debug.Stack()))...)
			w.st.fail()
			next = pos
		}
	}()
	for pos < len(items) {
		it := items[pos]
		items[pos] = queued{} // the payload is the applier's alone from here; drop the queue's reference
		pos++
		q.release(&it)
		if it.lost > 0 {
			w.st.dropped()
			continue
		}
		w.st.Handle(nil, it.seq, it.payload, it.at)
	}
	w.st.Tick(time.Now())
	return pos
}

// handshakeFailure describes a failed handshake: the ZMQ_PROTOCOL_ERROR_* value of a
// HANDSHAKE_FAILED_PROTOCOL event (zmq.h), the errno of a HANDSHAKE_FAILED_NO_DETAIL one.
func handshakeFailure(ev zmq.Event, val int) string {
	if ev == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL {
		return fmt.Sprintf("connection broke during the handshake (%s; a NULL publisher where CURVE is required may hang up first)",
			syscall.Errno(val).Error())
	}
	switch val {
	case 0x11000001:
		return "cryptographic error (a publisher with the wrong server key)"
	case 0x11000002:
		return "mechanism mismatch (a NULL publisher where CURVE is required, or the reverse)"
	}
	return fmt.Sprintf("protocol error %#x", val)
}

func (rd *reader) configure(sock *zmq.Socket) error {
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
	// libzmq checks each frame's announced size before allocating it and disconnects the sender of a
	// larger one (one 300 MiB frame cost 900 MB of process memory without it).
	if err := set("maxmsgsize", sock.SetMaxmsgsize(rd.cfg.maxMessageBytes())); err != nil {
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
	// Topics are subscribed by session, before the first receive: a SUB sends its subscriptions to every
	// publisher as it connects, and again to all when one is added.
	if rd.cfg.Mode == "bind" {
		if err := rd.configurePolicy(sock); err != nil {
			return err
		}
		if ipv6Host(rd.cfg.Endpoint) {
			// libzmq binds an IPv6 literal only with ZMQ_IPV6 ("tcp://[::]:5557" is then dual-stack).
			if err := set("ipv6", sock.SetIpv6(true)); err != nil {
				return err
			}
		}
		if err := sock.Bind(rd.cfg.Endpoint); err != nil {
			return fmt.Errorf("cannot bind SUB to %q: %w", rd.cfg.Endpoint, err)
		}
		return nil
	}
	if err := sock.Connect(rd.cfg.Endpoint); err != nil {
		return fmt.Errorf("cannot connect SUB to %q: %w", rd.cfg.Endpoint, err)
	}
	return nil
}

// configurePolicy makes sock ask the ZAP handler about each connection, under the socket's own domain (so
// each socket has its own allow-list), and, with CURVE, a CURVE server. It refuses when the handler is not
// running: libzmq would then admit every peer (zapHandler).
func (rd *reader) configurePolicy(sock *zmq.Socket) error {
	p := rd.policy
	if p == nil {
		return nil
	}
	if !rd.s.zap.started || rd.s.zap.err != nil {
		// zap.started and zap.err are written once, under Subscriber.mu, before this goroutine started.
		return fmt.Errorf("cannot admit publishers: the ZAP handler is not running (%v)", rd.s.zap.err)
	}
	if err := sock.SetZapDomain(p.domain); err != nil {
		return fmt.Errorf("cannot set zap_domain: %w", err)
	}
	if p.curve {
		if err := sock.SetCurveServer(1); err != nil {
			return fmt.Errorf("cannot set curve_server: %w", err)
		}
		if err := sock.SetCurveSecretkey(rd.cfg.CurveSecretKey); err != nil {
			// The key is not in the error: it is secret.
			return fmt.Errorf("cannot set curve_secretkey: %w", err)
		}
	}
	return nil
}

// zmqReplayer asks the engine's ROUTER for buffered batches through a DEALER socket created, used and
// closed by the applier goroutine that calls Replay (from inside Stream.Handle).
type zmqReplayer struct {
	w *worker
}

// Replay implements Replayer: it sends ["", start as 8-byte big-endian] and reads replies until the end
// marker, accepting both layouts (docs/internals/vllm-kv-events.md):
// ["", seq, payload] before vllm-project/vllm#45177 and ["", topic, seq, payload] since.
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
	// A reply frame over the limit disconnects the replay server; the replay then fails at its deadline.
	if err := sock.SetMaxmsgsize(w.cfg.maxMessageBytes()); err != nil {
		return fmt.Errorf("cannot set maxmsgsize: %w", err)
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
		var parts [4][]byte
		n, err := recvParts(sock, parts[:])
		if err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				continue
			}
			return fmt.Errorf("cannot receive replay: %w", err)
		}
		frames := parts[:min(n, len(parts))]
		// Drop the DEALER's empty delimiter; a sequence frame is never empty.
		if len(frames) > 0 && len(frames[0]) == 0 {
			frames, n = frames[1:], n-1
		}
		if n > len(frames) {
			return fmt.Errorf("cannot parse replay reply: %d frames", n)
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
