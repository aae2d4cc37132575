package sim

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// alivePoll is how often a waiting request checks that its client is still connected.
const alivePoll = 20 * time.Millisecond

// Engine is one simulated vLLM engine: an HTTP server, a prefix cache, a scheduler and an
// optional KV event publisher. Create it with New, run it with Start, end it with Stop.
// All methods are safe for concurrent use.
type Engine struct {
	cfg       Config
	faults    atomic.Pointer[Faults]
	modelJSON []byte
	idPrefix  string
	createdAt float64       // unix seconds, for the *_created metrics
	startBits atomic.Uint64 // math.Float64bits of process_start_time_seconds: set by New, and by Restart

	mu       sync.Mutex
	cache    *prefixCache
	log      *eventLog // nil when KV events are off
	running  int
	waitHead *request
	waitTail *request
	waiting  int
	queried  uint64 // prompt tokens looked up in the cache
	hits     uint64 // prompt tokens found in the cache

	// Disaggregated serving, under mu: blocks held for decode engines to pull, and the
	// tokens of remote-prefilled requests (vllm:external_prefix_cache_*).
	holds         map[string]*kvHold
	heldBlocks    int
	expiredReqs   uint64
	expiredBlocks uint64
	extQueried    uint64
	extHits       uint64
	xfer          histogram // vllm:nixl_xfer_time_seconds
	// SGLang's protocol, under mu: rooms held for decode engines (and tombstones of rooms whose
	// decode gave up first), and a channel closed and replaced whenever a room is held.
	rooms      map[string]*room
	roomSignal chan struct{}
	// LoRA adapters, under mu: the registry and the GPU slots (lora.go).
	lora loraState

	requests     atomic.Uint64
	completed    atomic.Uint64
	hitRequests  atomic.Uint64
	missRequests atomic.Uint64
	errorsSent   atomic.Uint64
	errorSeq     atomic.Uint64
	disconnects  atomic.Uint64
	aborts       atomic.Uint64
	restarts     atomic.Uint64
	idSeq        atomic.Uint64

	batches    atomic.Uint64
	dropped    atomic.Uint64
	garbage    atomic.Uint64
	nextSeq    atomic.Uint64
	sendErrors atomic.Uint64

	remotePrefills atomic.Uint64
	remoteDecodes  atomic.Uint64
	pullsServed    atomic.Uint64
	pullsRefused   atomic.Uint64
	pullsFailed    atomic.Uint64
	failedNotifs   atomic.Uint64
	blocksSent     atomic.Uint64
	blocksReceived atomic.Uint64
	roomsServed    atomic.Uint64
	roomsExpired   atomic.Uint64
	roomsAborted   atomic.Uint64
	roomDecodes    atomic.Uint64
	roomsFailed    atomic.Uint64

	reqPool sync.Pool

	ln       net.Listener
	srv      *fasthttp.Server
	pub      *publisher
	sideLn   net.Listener // the block pull side channel of a prefilling engine
	sideSrv  *fasthttp.Server
	stopCh   chan struct{}
	wg       sync.WaitGroup
	started  atomic.Bool
	stopOnce sync.Once
}

// New validates cfg, fills its defaults and returns an engine that is not yet listening.
func New(cfg Config) (*Engine, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("cannot configure sim engine: %w", err)
	}
	if cfg.KVEvents != "" && !haveZMQ {
		return nil, errNoZMQ
	}
	e := &Engine{
		cfg:       cfg,
		modelJSON: appendJSONString(nil, cfg.Model),
		createdAt: float64(time.Now().UnixNano()) / 1e9,
		stopCh:    make(chan struct{}),
	}
	e.startBits.Store(math.Float64bits(e.createdAt))
	var salt [8]byte
	_, _ = rand.Read(salt[:])
	e.idPrefix = hex.EncodeToString(salt[:])
	if e.cfg.EngineID == "" {
		e.cfg.EngineID = newUUID()
	}
	e.holds = make(map[string]*kvHold)
	e.rooms = make(map[string]*room)
	e.roomSignal = make(chan struct{})
	e.lora.init(&e.cfg)
	f := cfg.Faults
	e.faults.Store(&f)
	if cfg.KVEvents != "" {
		e.log = newEventLog(cfg.Era, cfg.HashMode)
	}
	e.cache = newPrefixCache(cfg.NumBlocks, cfg.BlockSize, e.log)
	e.reqPool.New = func() any { return newRequest(e) }
	return e, nil
}

// quietLogger drops fasthttp's per-connection errors: clients that go away mid-stream are
// part of the simulation, not news.
type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// Config returns the configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Start listens on the HTTP address and the ZMQ endpoints and serves until Stop.
func (e *Engine) Start() error {
	if e.stopped() || !e.started.CompareAndSwap(false, true) {
		return errors.New("cannot start sim engine: already started or stopped")
	}
	addr := net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %q: %w", addr, err)
	}
	if e.cfg.KVEvents != "" {
		p, err := startPublisher(e)
		if err != nil {
			_ = ln.Close()
			close(e.stopCh)
			return err
		}
		e.pub = p
	}
	if e.cfg.Role.prefills() {
		if err := e.startSideChannel(); err != nil {
			_ = ln.Close()
			if e.pub != nil {
				e.pub.close()
			}
			close(e.stopCh)
			return fmt.Errorf("cannot listen for block pulls on %q: %w", net.JoinHostPort(e.cfg.Host, strconv.Itoa(e.cfg.SideChannelPort)), err)
		}
	}
	e.ln = ln
	e.srv = &fasthttp.Server{
		Handler:              e.serveHTTP,
		Name:                 "uvicorn", // what vLLM's server says
		IdleTimeout:          e.cfg.IdleTimeout,
		ReadTimeout:          time.Minute,
		MaxRequestBodySize:   64 << 20, // long prompts
		NoDefaultContentType: true,
		CloseOnShutdown:      true,
		// The worker pool's cleaner goroutine sleeps this long before it sees Stop (default 10s).
		MaxIdleWorkerDuration: 100 * time.Millisecond,
		Logger:                quietLogger{},
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		_ = e.srv.Serve(ln)
	}()
	return nil
}

// Stop stops serving: waiting and hung requests get 503, streams are cut, the listener, the
// connections and the ZMQ sockets close, and the engine's goroutines have exited when Stop
// returns; fasthttp's idle worker goroutines follow within MaxIdleWorkerDuration (100ms).
// Stop may be called more than once, and before Start.
func (e *Engine) Stop() {
	e.stopOnce.Do(func() {
		if !e.started.Load() {
			close(e.stopCh)
			return
		}
		select {
		case <-e.stopCh: // Start failed
			return
		default:
		}
		close(e.stopCh)
		if e.srv != nil {
			_ = e.srv.Shutdown()
		}
		// Shutdown only closes listeners Serve has registered: one called right after Start can run before
		// the Serve goroutine did, which would then serve forever. Closing the listener ends it either way.
		_ = e.ln.Close()
		if e.sideSrv != nil {
			_ = e.sideSrv.Shutdown()
			_ = e.sideLn.Close()
		}
		e.wg.Wait()
		e.releaseHolds()
		e.releaseRooms()
		if e.pub != nil {
			e.pub.close()
		}
	})
}

func (e *Engine) stopped() bool {
	select {
	case <-e.stopCh:
		return true
	default:
		return false
	}
}

// Addr returns the host:port the HTTP server listens on; empty before Start.
func (e *Engine) Addr() string {
	if e.ln == nil {
		return ""
	}
	return e.ln.Addr().String()
}

// URL returns "http://" + Addr().
func (e *Engine) URL() string { return "http://" + e.Addr() }

// KVEventsEndpoint returns an endpoint a SUB can connect to, e.g. "tcp://127.0.0.1:41234"
// (wildcard hosts become loopback); for a connecting publisher the configured endpoint.
// Empty when KV events are off or before Start.
func (e *Engine) KVEventsEndpoint() string {
	if e.pub == nil {
		return ""
	}
	return e.pub.pubEndpoint
}

// ReplayEndpoint returns an endpoint a DEALER can connect to, or "" when replay is off.
func (e *Engine) ReplayEndpoint() string {
	if e.pub == nil {
		return ""
	}
	return e.pub.replayEndpoint
}

// Faults returns the faults in effect.
func (e *Engine) Faults() Faults { return *e.faults.Load() }

// SetFaults replaces the faults of a running engine; requests that already started keep the
// faults they saw.
func (e *Engine) SetFaults(f Faults) error {
	if errs := f.validate(); len(errs) > 0 {
		return fmt.Errorf("cannot set faults: %w", errors.Join(errs...))
	}
	e.faults.Store(&f)
	return nil
}

// Restart simulates an engine restart: the prefix cache is emptied (blocks held by running
// requests are dropped from the cache and freed when those requests end), pending events are
// discarded, the replay buffer is emptied and the event sequence starts again at 0 with a batch
// holding AllBlocksCleared. Requests in flight continue.
func (e *Engine) Restart() {
	e.startBits.Store(math.Float64bits(float64(time.Now().UnixNano()) / 1e9))
	e.mu.Lock()
	e.cache.clear()
	if e.log != nil {
		e.log.reset()
	}
	e.mu.Unlock()
	e.restarts.Add(1)
}

// startTime is process_start_time_seconds: when the engine was made, or last restarted.
func (e *Engine) startTime() float64 { return math.Float64frombits(e.startBits.Load()) }

// Stats is a snapshot of the engine's counters.
type Stats struct {
	Requests      uint64 // completion requests received
	Completed     uint64 // completion requests answered in full
	HitRequests   uint64 // admitted requests with at least one cached block
	MissRequests  uint64 // admitted requests with no cached block
	QueriedTokens uint64 // prompt tokens looked up (vllm:prefix_cache_queries_total)
	HitTokens     uint64 // prompt tokens found cached (vllm:prefix_cache_hits_total)
	Running       int
	Waiting       int
	CachedBlocks  int     // blocks in the prefix cache
	UsedBlocks    int     // blocks held by running requests
	KVUsage       float64 // UsedBlocks / NumBlocks (vllm:kv_cache_usage_perc)
	Evictions     uint64  // cached blocks evicted
	Errors        uint64  // injected HTTP 500s
	Disconnects   uint64  // requests whose client went away before the end
	Aborts        uint64  // streams cut by AbortAfterChunks
	Restarts      uint64

	// Disaggregated serving. Prefill side:
	RemotePrefills uint64 // do_remote_decode requests prefilled for a decode engine
	HeldBlocks     int    // blocks held for decode engines to pull
	PullsServed    uint64 // pulls answered with blocks
	PullsRefused   uint64 // pulls refused (unknown or expired request, wrong engine id, garbage)
	BlocksSent     uint64 // blocks moved to decode engines
	ExpiredReqs    uint64 // holds freed unpulled after KVLease (vllm:nixl_num_kv_expired_reqs)
	ExpiredBlocks  uint64 // full blocks of those holds
	// Decode side:
	RemoteDecodes  uint64 // do_remote_prefill requests received
	PullsFailed    uint64 // pulls that failed (vllm:nixl_num_failed_transfers)
	FailedNotifs   uint64 // empty pulls (a full local hit) the prefill engine refused (vllm:nixl_num_failed_notifications)
	BlocksReceived uint64 // blocks read from prefill engines

	// SGLang's protocol (bootstrap_room). Prefill side:
	RoomsServed  uint64 // rooms whose blocks a decode engine read
	RoomsExpired uint64 // rooms no decode read within BootstrapTimeout (sglang:num_bootstrap_failed_reqs)
	RoomsAborted uint64 // rooms freed because the prefill's client or the decode request gave up
	// Decode side:
	RoomDecodes uint64 // bootstrap_room requests received
	RoomsFailed uint64 // rooms that never came or could not be read (sglang:num_transfer_failed_reqs)

	BatchesPublished uint64 // event batches given a sequence number (sent or dropped)
	BatchesDropped   uint64 // batches not sent (DropEveryNthBatch)
	GarbageSent      uint64 // garbage messages sent
	NextSeq          uint64 // sequence number of the next batch
	SendErrors       uint64 // failed ZMQ sends

	// LoRA adapters.
	LoRALoads      uint64 // adapters loaded into a GPU slot (rolter_sim_lora_loads_total)
	LoRAEvictions  uint64 // adapters evicted from a GPU slot to make room for another
	LoRAAPILoads   uint64 // successful POST /v1/load_lora_adapter calls
	LoRAAPIUnloads uint64 // successful POST /v1/unload_lora_adapter calls
	LoRASlots      int    // adapters in GPU slots now
}

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	s := Stats{
		QueriedTokens: e.queried,
		HitTokens:     e.hits,
		Running:       e.running,
		Waiting:       e.waiting,
		CachedBlocks:  e.cache.cachedBlocks(),
		UsedBlocks:    e.cache.usedBlocks(),
		Evictions:     e.cache.evictions,
		HeldBlocks:    e.heldBlocks,
		ExpiredReqs:   e.expiredReqs,
		ExpiredBlocks: e.expiredBlocks,

		LoRALoads:      e.lora.loads,
		LoRAEvictions:  e.lora.evictions,
		LoRAAPILoads:   e.lora.apiLoads,
		LoRAAPIUnloads: e.lora.apiUnloads,
		LoRASlots:      len(e.lora.slots),
	}
	e.mu.Unlock()
	s.RemotePrefills = e.remotePrefills.Load()
	s.PullsServed = e.pullsServed.Load()
	s.PullsRefused = e.pullsRefused.Load()
	s.BlocksSent = e.blocksSent.Load()
	s.RemoteDecodes = e.remoteDecodes.Load()
	s.PullsFailed = e.pullsFailed.Load()
	s.FailedNotifs = e.failedNotifs.Load()
	s.BlocksReceived = e.blocksReceived.Load()
	s.RoomsServed = e.roomsServed.Load()
	s.RoomsExpired = e.roomsExpired.Load()
	s.RoomsAborted = e.roomsAborted.Load()
	s.RoomDecodes = e.roomDecodes.Load()
	s.RoomsFailed = e.roomsFailed.Load()
	s.KVUsage = float64(s.UsedBlocks) / float64(e.cfg.NumBlocks)
	s.Requests = e.requests.Load()
	s.Completed = e.completed.Load()
	s.HitRequests = e.hitRequests.Load()
	s.MissRequests = e.missRequests.Load()
	s.Errors = e.errorsSent.Load()
	s.Disconnects = e.disconnects.Load()
	s.Aborts = e.aborts.Load()
	s.Restarts = e.restarts.Load()
	s.BatchesPublished = e.batches.Load()
	s.BatchesDropped = e.dropped.Load()
	s.GarbageSent = e.garbage.Load()
	s.NextSeq = e.nextSeq.Load()
	s.SendErrors = e.sendErrors.Load()
	return s
}

// injectError decides deterministically whether this request gets the ErrorRate fault:
// request n fails when floor((n+1)*rate) > floor(n*rate), so exactly rate of them fail.
func (e *Engine) injectError(rate float64) bool {
	if rate <= 0 {
		return false
	}
	n := float64(e.errorSeq.Add(1) - 1)
	return math.Floor((n+1)*rate) > math.Floor(n*rate)
}

// The scheduler. vLLM runs at most max_num_seqs requests; the rest wait in FIFO order. A
// request is admitted when a slot is free and the cache can give it blocks for its prompt and
// all its output tokens (reserved up front, so the sim never preempts). A request of a LoRA
// adapter also needs the adapter in a GPU slot (lora.go); one held back only by that is
// skipped, as vLLM's scheduler skips it, and the requests behind it may start.

// tryStart admits r if it can run now; loraBlocked reports that r's adapter alone kept it
// out. Called with e.mu held.
func (e *Engine) tryStart(r *request) (ok, loraBlocked bool) {
	if e.running >= e.cfg.MaxNumSeqs {
		return false, false
	}
	if r.lora != nil && !e.lora.canRun(r.lora, e.cfg.MaxLoRAs) {
		return false, true
	}
	// vLLM computes at least one prompt token, so a prompt of whole blocks hits one block less
	// (kv_cache_manager.py: max_cache_hit_length = num_tokens - 1).
	limit := (len(r.tokens) - 1) / e.cfg.BlockSize
	hit := e.cache.match(r.hashes, max(limit, 0))
	need := blocksFor(len(r.tokens)+r.maxTokens, e.cfg.BlockSize) - hit
	if !e.cache.fits(r.hashes, hit, need) {
		return false, false
	}
	r.held = e.cache.pin(r.held[:0], r.hashes[:hit])
	e.cache.allocate(need)
	r.private = need
	r.hit = hit
	r.cached = hit * e.cfg.BlockSize
	if r.pulledEnd > 0 {
		// Blocks read from a prefill engine extend the local hit when they start inside it. As
		// vLLM, a prompt read in full recomputes its last token.
		e.extQueried += uint64(len(r.tokens))
		if hit >= r.pulledStart && r.pulledEnd > hit {
			r.cached = min(r.pulledEnd*e.cfg.BlockSize, len(r.tokens)-1)
			e.extHits += uint64(r.cached - hit*e.cfg.BlockSize)
		}
	}
	r.prefill = time.Duration(len(r.tokens)-r.cached) * e.cfg.PrefillPerToken
	if r.lora != nil {
		// The adapter's load, started now or by an earlier request, ends before the prefill.
		r.prefill += e.lora.start(r.lora, &e.cfg, time.Now())
	}
	r.state = stRunning
	e.running++
	e.queried += uint64(len(r.tokens))
	e.hits += uint64(hit * e.cfg.BlockSize)
	if hit > 0 {
		e.hitRequests.Add(1)
	} else {
		e.missRequests.Add(1)
	}
	return true, false
}

// admit returns when r runs (true), or when its client went away or the engine stopped
// (false; r holds nothing then).
func (e *Engine) admit(r *request) bool {
	if e.stopped() || !r.alive() {
		return false
	}
	e.mu.Lock()
	loraBlocked := false
	if e.waitHead == nil {
		var ok bool
		if ok, loraBlocked = e.tryStart(r); ok {
			e.mu.Unlock()
			return true
		}
	}
	r.state = stWaiting
	if e.waitTail != nil {
		e.waitTail.next = r
	} else {
		e.waitHead = r
	}
	e.waitTail = r
	e.waiting++
	if r.lora != nil {
		r.lora.waiting++
	}
	if loraBlocked {
		e.setLoRABlocked(r, true)
	} else if e.lora.blocked > 0 {
		// Requests held back by their adapter do not hold back r: it may start past them.
		e.schedule()
	}
	e.mu.Unlock()
	for {
		if r.conn != nil {
			r.timer.Reset(alivePoll)
		}
		select {
		case <-r.ready:
			r.timer.Stop()
			return true
		case <-e.stopCh:
		case <-r.timer.C:
			if r.alive() {
				continue
			}
		}
		r.timer.Stop()
		e.finish(r)
		return false
	}
}

// schedule admits waiting requests in FIFO order while they fit, skipping those only their
// LoRA adapter holds back. Called with e.mu held.
func (e *Engine) schedule() {
	var prev *request
	for r := e.waitHead; r != nil && e.running < e.cfg.MaxNumSeqs; {
		next := r.next
		ok, loraBlocked := e.tryStart(r)
		if ok {
			e.unlink(prev, r)
			r.ready <- struct{}{}
			r = next
			continue
		}
		if !loraBlocked {
			if r.loraBlocked {
				e.setLoRABlocked(r, false)
			}
			return
		}
		if !r.loraBlocked {
			e.setLoRABlocked(r, true)
		}
		prev, r = r, next
	}
}

// setLoRABlocked marks the waiting request r as held back by its adapter, or no longer.
// Called with e.mu held.
func (e *Engine) setLoRABlocked(r *request, on bool) {
	r.loraBlocked = on
	e.lora.blockedChanged(on)
}

// dequeue removes r from the waiting list. Called with e.mu held.
func (e *Engine) dequeue(r *request) {
	var prev *request
	for p := e.waitHead; p != nil && p != r; p = p.next {
		prev = p
	}
	e.unlink(prev, r)
}

// unlink removes r, which follows prev (nil: r is the head), from the waiting list. Called
// with e.mu held.
func (e *Engine) unlink(prev, r *request) {
	if prev == nil {
		e.waitHead = r.next
	} else {
		prev.next = r.next
	}
	if e.waitTail == r {
		e.waitTail = prev
	}
	r.next = nil
	e.waiting--
	if r.lora != nil {
		r.lora.waiting--
	}
	if r.loraBlocked {
		e.setLoRABlocked(r, false)
	}
}

// prefilled caches the blocks r computed during prefill.
func (e *Engine) prefilled(r *request) {
	e.mu.Lock()
	if r.state == stRunning {
		var used int
		r.held, used = e.cache.store(r.held, r.hashes, r.hit, r.tokens, r.lora)
		r.private -= used
	}
	e.mu.Unlock()
}

// finish ends r wherever it is: a waiting request leaves the queue, a running one frees its
// blocks and slot and lets waiting requests in. It is idempotent.
func (e *Engine) finish(r *request) {
	e.mu.Lock()
	switch r.state {
	case stWaiting:
		e.dequeue(r)
	case stRunning:
		e.cache.release(r.held, r.private)
		r.held = r.held[:0]
		r.private = 0
		e.stopRunning(r)
		e.schedule()
	}
	r.state = stDone
	e.mu.Unlock()
	// An admission may have raced with the caller giving up; drain it so r can be reused.
	select {
	case <-r.ready:
	default:
	}
}

// stopRunning gives back r's running slot and its adapter's use. Called with e.mu held.
func (e *Engine) stopRunning(r *request) {
	e.running--
	if r.lora != nil {
		e.lora.stop(r.lora)
	}
}

// complete ends r after its last token: a do_remote_decode request on a prefilling engine
// keeps its blocks for a decode engine to pull, a bootstrap_room request keeps them under its
// room; any other request finishes.
func (e *Engine) complete(r *request) {
	if !e.cfg.Role.prefills() || (!r.kv.doRemoteDecode && !r.boot.set) {
		e.finish(r)
		return
	}
	e.mu.Lock()
	if r.state == stRunning {
		if r.boot.set {
			e.holdRoom(r)
		} else {
			e.hold(r)
		}
		e.stopRunning(r)
		e.schedule()
		r.state = stDone
	}
	e.mu.Unlock()
	e.finish(r)
}

// pause waits d, or less when the client goes away or the engine stops; it reports whether
// the whole of d passed.
func (e *Engine) pause(r *request, d time.Duration) bool {
	if d <= 0 {
		return r.alive()
	}
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return r.alive()
		}
		if r.conn != nil && left > alivePoll {
			left = alivePoll
		}
		r.timer.Reset(left)
		select {
		case <-r.timer.C:
		case <-e.stopCh:
			r.timer.Stop()
			return false
		}
		if !r.alive() {
			return false
		}
	}
}

// alive reports whether the client is still connected, looking at the socket at most every
// alivePoll.
func (r *request) alive() bool {
	if r.gone {
		return false
	}
	if r.conn == nil {
		return true
	}
	now := time.Now()
	if now.Sub(r.lastAlive) < alivePoll/2 {
		return true
	}
	r.lastAlive = now
	if !connAlive(r.conn) {
		r.gone = true
		return false
	}
	return true
}

// generate runs a non-stream request to its last token.
func (e *Engine) generate(r *request) bool {
	if !e.admit(r) {
		return false
	}
	ok := e.pause(r, r.prefill)
	if ok {
		e.prefilled(r)
		ok = e.pause(r, time.Duration(r.maxTokens-1)*e.cfg.DecodePerToken)
	}
	if ok {
		e.complete(r)
	} else {
		e.finish(r)
	}
	return ok
}

// hang holds a slot until the client goes away or the engine stops.
func (e *Engine) hang(r *request) {
	if !e.admit(r) {
		return
	}
	for e.pause(r, time.Hour) {
	}
	e.finish(r)
}

func (e *Engine) getRequest() *request {
	return e.reqPool.Get().(*request)
}

func (e *Engine) putRequest(r *request) {
	r.reset()
	e.reqPool.Put(r)
}

// hashPrompt computes the block hashes of r's full prompt blocks.
func (e *Engine) hashPrompt(r *request) {
	var extra string
	if r.lora != nil {
		extra = r.lora.name
	}
	r.hashes, r.cborBuf = appendBlockHashes(r.hashes[:0], r.cborBuf, r.tokens, e.cfg.BlockSize, extra)
}

// newID sets r.id: the X-Request-Id when given (as vLLM does), else a fresh hex id.
func (e *Engine) newID(r *request, prefix string, requestID []byte) {
	r.id = append(r.id[:0], prefix...)
	if len(requestID) > 0 && len(requestID) <= 128 && plainID(requestID) {
		r.id = append(r.id, requestID...)
		return
	}
	r.id = append(r.id, e.idPrefix...)
	var b [8]byte
	n := e.idSeq.Add(1)
	for i := range b {
		b[i] = byte(n >> (56 - 8*i))
	}
	r.id = hex.AppendEncode(r.id, b[:])
}

// newUUID returns a random version 4 UUID, the form of vLLM's default engine_id.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// plainID reports whether id can go into a JSON string unescaped.
func plainID(id []byte) bool {
	for _, c := range id {
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
