package cluster

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/telemetry"
)

// Gateway is what a Cluster needs of the gateway it serves; *engine.Gateway is one. A Gateway that also has
// MaxConns(func(provider string, n int64)) caps each peer's in-flight claim on a provider at its max_conns.
type Gateway interface {
	SetPeers(p engine.Peers)
	SetPeerLoads(loads map[string]int64)
	Inflight(fn func(provider string, n int64))
	SetLimitShare(replicas int)
}

var (
	_ Gateway      = (*engine.Gateway)(nil)
	_ engine.Peers = (*Cluster)(nil)
)

// NATS connection settings. A replica keeps trying to reach NATS for as long as it runs; while it cannot,
// it routes on its own evidence (and the peers' it already has), so nothing waits on a reconnect.
const (
	reconnectWait   = 500 * time.Millisecond
	reconnectJitter = 100 * time.Millisecond
	dialTimeout     = 2 * time.Second
	// pingInterval and maxPingsOut find a connection that died without a FIN (a partition) in 10-15 s.
	pingInterval = 5 * time.Second
	maxPingsOut  = 2
	// Per subscription, the messages nats.go holds for a handler that fell behind before it drops them
	// (counted as slow_consumer); 64 MiB is 2000 full evidence batches.
	pendingMsgs  = 4096
	pendingBytes = 64 << 20
	// dedupSlots is the size of the publisher's direct-mapped set of the records already sent this interval.
	dedupSlots = 1024
	// warnEvery spaces the warnings that messages can cause (malformed input, publish errors).
	warnEvery = time.Minute
)

// Kinds of message, and why one is dropped (the metrics' labels).
const (
	kindEvidence = iota
	kindLoad
	numKinds
)

var kindNames = [numKinds]string{"evidence", "load"}

const (
	dropQueueFull = iota
	dropMalformed
	dropPublishFailed
	numDrops
)

var dropNames = [numDrops]string{"queue_full", "malformed", "publish_failed"}

var errNotConnected = errors.New("cannot publish: not connected to NATS")

// Cluster shares this gateway's routing evidence and in-flight counts with the other replicas of its fleet
// over NATS, and gives the gateway theirs (engine.Peers and Gateway.SetPeerLoads). The package doc has the
// design. Held and Routed are safe for concurrent use; Close stops everything.
type Cluster struct {
	g        Gateway
	log      *slog.Logger
	id       uint64
	name     string // "rolter-" + 16 hex digits of id: the NATS connection's name and the load messages' id
	interval time.Duration
	subjects [numKinds]string

	table *table
	loads *peerLoads
	// queue holds what Routed was told until the publisher encodes it; pending approximates its bytes, and
	// crossing batchBytes kicks the publisher before its interval.
	queue   chan record
	pending atomic.Int64
	kick    chan struct{}

	nc   *nats.Conn
	subs [numKinds]*nats.Subscription
	send func(subject string, msg []byte) error // publishes; replaced in tests

	// Handlers hold hmu's read lock while they run; Close takes the write lock to set closed, after which
	// no handler touches the gateway.
	hmu    sync.RWMutex
	closed bool

	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	set       *telemetry.Set

	sent, received [numKinds]atomic.Uint64
	dropped        [numDrops]atomic.Uint64
	// reconnectLogged: the first failed (re)connect attempt after a transition to down was logged.
	reconnectLogged atomic.Bool
	lastWarn        atomic.Int64 // unix nanoseconds of the last message-caused warning

	// With a shared key: the MACs of the publisher and of each subscription's handler (each has its own,
	// a hash is not safe for concurrent use); all nil without one.
	signers [numKinds + 1]*signer
	// evPeers is the evidence handler's own: each sender's last timestamp and rate bucket.
	evPeers         *evidencePeers
	maxPeerInflight int64
	refused         [numRefusals]atomic.Uint64
	authLogged      atomic.Bool // the servers' refusal of the credentials was logged since the last connect

	// Owned by the publisher goroutine.
	batch  []byte
	hdr    int   // the batch header's bytes: envelope or version byte, then the replica id
	lastTS int64 // the last envelope's timestamp, for strictly increasing ones
	recent [dedupSlots]uint64
}

// The signers' slots: one per kind for its handler, and the publisher's.
const signPublisher = numKinds

// record is one Routed call: an engine and the checkpoints of the key sent to it.
type record struct {
	engine uint64
	n      uint8
	cps    [maxCheckpoints]uint64
}

// Stats is a Cluster's state and counts so far.
type Stats struct {
	ID        string // this replica's id
	Connected bool
	Peers     int // peer replicas heard from recently
	Entries   int // slots of the evidence table ever filled
	Slots     int // the evidence table's size

	EvidenceSent, EvidenceReceived uint64 // messages
	LoadSent, LoadReceived         uint64 // messages
	QueueFull                      uint64 // Routed calls dropped
	Malformed                      uint64 // messages dropped
	PublishFailed                  uint64 // messages not sent (NATS down, or refused)
	SlowConsumer                   uint64 // messages nats.go dropped because a handler fell behind
	// Refused counts the messages (and in-flight claims, inflight_capped) refused by reason: unauthenticated,
	// bad_mac, stale, replayed, too_many_peers, rate_limited, inflight_capped.
	Refused map[string]uint64
}

// Start connects the gateway to the other replicas: it installs itself as g's Peers, publishes g's routed
// evidence and in-flight counts, and hands the peers' in-flight counts to g. Zero fields of cfg take
// config.Default's values; an empty NATSURL is an error. NATS is dialled through the egress policy of
// egressCfg.
//
// Start does not wait for NATS: when no server can be reached it returns a Cluster that keeps trying in the
// background (logged, and rolter_cluster_connected is 0), while g routes on its own evidence.
func Start(cfg config.ClusterConfig, egressCfg egress.Config, g Gateway, log *slog.Logger) (*Cluster, error) {
	if cfg.NATSURL == "" {
		return nil, errors.New("cannot start cluster: no nats_url")
	}
	cfg = withDefaults(cfg)
	policy, err := egress.New(egressCfg)
	if err != nil {
		return nil, fmt.Errorf("cannot start cluster: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	var key []byte
	if cfg.KeyEnv != "" {
		if key = []byte(os.Getenv(cfg.KeyEnv)); len(key) < config.MinClusterKeyBytes {
			return nil, fmt.Errorf("cannot start cluster: environment variable %s must hold a key of at least %d bytes",
				cfg.KeyEnv, config.MinClusterKeyBytes)
		}
	}
	auth, err := natsAuth(cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot start cluster: %w", err)
	}
	var idb [8]byte
	_, _ = crand.Read(idb[:]) // never fails (crypto/rand, Go 1.24)
	c := newCluster(cfg, g, binary.LittleEndian.Uint64(idb[:]), key)
	c.log = log.With("component", "cluster", "replica", c.name)
	if key == nil {
		c.log.Warn("cluster messages are not authenticated: any client that can publish on the subject can steer routing; set [cluster] key_env")
	}

	dialer := natsDialer{d: &egress.Dialer{Policy: policy}, timeout: dialTimeout}
	if cg, ok := g.(interface {
		ClusterDialer(*egress.Policy) *egress.Dialer
	}); ok {
		// A real gateway's dialer also counts what it refuses (rolter_egress_refused_total{use="cluster"}).
		dialer.d = cg.ClusterDialer(policy)
	}
	opts := append([]nats.Option{
		nats.Name(c.name),
		nats.NoEcho(),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(reconnectWait),
		nats.ReconnectJitter(reconnectJitter, reconnectJitter),
		// Evidence is worth nothing late: what cannot be sent now is dropped, not buffered for a reconnect.
		nats.ReconnectBufSize(-1),
		nats.Timeout(dialTimeout),
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		// The egress dialer resolves the name itself, checks every address and dials a checked one.
		nats.SkipHostLookup(),
		nats.SetCustomDialer(dialer),
		nats.NoCallbacksAfterClientClose(),
		nats.ConnectHandler(c.onConnect),
		nats.DisconnectErrHandler(c.onDisconnect),
		nats.ReconnectHandler(c.onReconnect),
		nats.ReconnectErrHandler(c.onReconnectErr),
		nats.ErrorHandler(c.onAsyncError),
	}, auth...)
	c.nc, err = nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to NATS %q: %w", redact(cfg.NATSURL), err)
	}
	c.send = c.publish
	c.loads.setKnown(c.claimCaps(c.ownInflight())) // before the first load message arrives
	handlers := [numKinds]nats.MsgHandler{kindEvidence: c.onEvidence, kindLoad: c.onLoad}
	for k, h := range handlers {
		s, err := c.nc.Subscribe(c.subjects[k], h)
		if err == nil {
			err = s.SetPendingLimits(pendingMsgs, pendingBytes)
		}
		if err != nil {
			c.nc.Close()
			return nil, fmt.Errorf("cannot subscribe to %q: %w", c.subjects[k], err)
		}
		c.subs[k] = s
	}
	c.registerMetrics()
	g.SetPeers(c)
	c.wg.Add(1)
	go c.run()
	c.log.Info("cluster started", "nats_url", redact(cfg.NATSURL), "subject", cfg.Subject, "connected", c.nc.IsConnected(),
		"evidence_slots", c.table.size(), "authenticated", key != nil)
	return c, nil
}

// natsAuth returns the options that present [cluster]'s NATS credentials and TLS files (the validator has
// checked them; this reads them).
func natsAuth(cfg config.ClusterConfig) ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case cfg.UserEnv != "" || cfg.PasswordEnv != "":
		opts = append(opts, nats.UserInfo(os.Getenv(cfg.UserEnv), os.Getenv(cfg.PasswordEnv)))
	case cfg.TokenEnv != "":
		opts = append(opts, nats.Token(os.Getenv(cfg.TokenEnv)))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("cannot use nkey_seed_file %q: %w", cfg.NKeySeedFile, err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCertFile, cfg.TLSKeyFile))
	}
	return opts, nil
}

// redact returns a comma-separated list of URLs with any password masked. The config refuses credentials
// in nats_url; this keeps a URL given some other way out of the logs all the same.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, raw := range parts {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// withDefaults fills the zero fields of cfg with config.Default's.
func withDefaults(cfg config.ClusterConfig) config.ClusterConfig {
	d := config.Default().Cluster
	if cfg.Subject == "" {
		cfg.Subject = d.Subject
	}
	if cfg.PublishIntervalMs <= 0 {
		cfg.PublishIntervalMs = d.PublishIntervalMs
	}
	if cfg.MaxEntries <= 0 {
		cfg.MaxEntries = d.MaxEntries
	}
	if cfg.EvidenceTTLSecs <= 0 {
		cfg.EvidenceTTLSecs = d.EvidenceTTLSecs
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = d.QueueSize
	}
	if cfg.MaxPeers <= 0 {
		cfg.MaxPeers = d.MaxPeers
	}
	if cfg.MaxPeerInflight <= 0 {
		cfg.MaxPeerInflight = d.MaxPeerInflight
	}
	if cfg.PeerEvidencePerSec <= 0 {
		cfg.PeerEvidencePerSec = d.PeerEvidencePerSec
	}
	return cfg
}

// newCluster builds a Cluster without NATS or goroutines (Start adds them; tests use it alone); key is the
// shared key, nil for none. Zero bounds take config.Default's.
func newCluster(cfg config.ClusterConfig, g Gateway, id uint64, key []byte) *Cluster {
	cfg = withDefaults(cfg)
	interval := time.Duration(cfg.PublishIntervalMs) * time.Millisecond
	// A peer is forgotten after three intervals without a word, and never sooner than a second: one lost
	// message must not zero its load.
	maxAge := max(3*interval, time.Second)
	c := &Cluster{
		g:               g,
		log:             slog.Default(),
		id:              id,
		name:            "rolter-" + hex.EncodeToString(binary.BigEndian.AppendUint64(nil, id)),
		interval:        interval,
		subjects:        [numKinds]string{cfg.Subject + ".evidence", cfg.Subject + ".load"},
		table:           newTable(cfg.MaxEntries, time.Duration(cfg.EvidenceTTLSecs*float64(time.Second))),
		loads:           newPeerLoads(g.SetPeerLoads, maxAge, cfg.MaxPeers),
		evPeers:         newEvidencePeers(cfg.MaxPeers, maxAge, float64(cfg.PeerEvidencePerSec)),
		maxPeerInflight: int64(cfg.MaxPeerInflight),
		queue:           make(chan record, cfg.QueueSize),
		kick:            make(chan struct{}, 1),
		batch:           make([]byte, 0, authHeader+batchBytes+maxRecordBytes),
	}
	if key != nil {
		for i := range c.signers {
			c.signers[i] = newSigner(key, c.subjects)
		}
	}
	c.batch = c.appendBatchHeader(c.batch)
	c.hdr = len(c.batch)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// natsDialer is the egress policy's dialer in the shape nats.SetCustomDialer takes.
type natsDialer struct {
	d       *egress.Dialer
	timeout time.Duration
}

func (n natsDialer) Dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), n.timeout)
	defer cancel()
	return n.d.DialContext(ctx, network, addr)
}

// Close stops publishing and receiving, unsubscribes, closes the NATS connection and removes the peers'
// evidence and loads from the gateway. No handler touches the gateway once it returns. Idempotent.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		c.g.SetPeers(nil)
		c.hmu.Lock()
		c.closed = true
		c.hmu.Unlock()
		c.loads.close()
		c.cancel()
		c.wg.Wait()
		for _, s := range c.subs {
			_ = s.Unsubscribe()
		}
		c.nc.Close()
		c.set.Unregister()
		c.log.Info("cluster stopped")
	})
}

// Held implements engine.Peers: how many leading checkpoints of cps the peers' evidence holds for engine.
// Lock-free and allocation-free; cps is not kept.
func (c *Cluster) Held(engine uint64, cps []uint64) int { return c.table.held(engine, cps) }

// Routed implements engine.Peers: it queues a copy of (engine, cps) for the next evidence message, at most
// maxCheckpoints of cps. It never blocks and does not allocate: with the queue full it drops the record and
// counts it (queue_full).
func (c *Cluster) Routed(engine uint64, cps []uint64) {
	if len(cps) == 0 {
		return
	}
	if len(c.queue) == cap(c.queue) {
		// Full: drop before copying the record, which the send below would refuse after the copy
		// (BenchmarkRouted/full: 16 ns against 49).
		c.dropped[dropQueueFull].Add(1)
		return
	}
	var r record
	r.engine = engine
	r.n = uint8(copy(r.cps[:], cps))
	select {
	case c.queue <- r:
	default:
		c.dropped[dropQueueFull].Add(1)
		return
	}
	if c.pending.Add(int64(recordBytes(int(r.n)))) >= batchBytes {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
}

// Stats returns the cluster's state and counts so far. Safe for concurrent use.
func (c *Cluster) Stats() Stats {
	return Stats{
		ID:               c.name,
		Connected:        c.connected(),
		Peers:            int(c.loads.live.Load()),
		Entries:          int(c.table.used.Load()),
		Slots:            c.table.size(),
		EvidenceSent:     c.sent[kindEvidence].Load(),
		EvidenceReceived: c.received[kindEvidence].Load(),
		LoadSent:         c.sent[kindLoad].Load(),
		LoadReceived:     c.received[kindLoad].Load(),
		QueueFull:        c.dropped[dropQueueFull].Load(),
		Malformed:        c.dropped[dropMalformed].Load(),
		PublishFailed:    c.dropped[dropPublishFailed].Load(),
		SlowConsumer:     c.slowConsumer(),
		Refused:          c.refusedCounts(),
	}
}

func (c *Cluster) refusedCounts() map[string]uint64 {
	m := make(map[string]uint64, numRefusals)
	for r := range numRefusals {
		m[refusalNames[r]] = c.refused[r].Load()
	}
	return m
}

// connected reports whether the NATS connection is up.
func (c *Cluster) connected() bool { return c.nc != nil && c.nc.IsConnected() }

// slowConsumer is the messages nats.go dropped for the subscriptions.
func (c *Cluster) slowConsumer() uint64 {
	var n uint64
	for _, s := range c.subs {
		if s == nil {
			continue
		}
		if d, err := s.Dropped(); err == nil && d > 0 {
			n += uint64(d)
		}
	}
	return n
}

func (c *Cluster) registerMetrics() {
	s := telemetry.NewSet()
	s.Gauge(telemetry.ClusterConnected, "", func() float64 {
		if c.connected() {
			return 1
		}
		return 0
	})
	s.Gauge(telemetry.ClusterPeers, "", func() float64 { return float64(c.loads.live.Load()) })
	s.Gauge(telemetry.ClusterEvidenceEntries, "", func() float64 { return float64(c.table.used.Load()) })
	for k := range numKinds {
		s.CounterFunc(telemetry.ClusterMessages, `kind="`+kindNames[k]+`",direction="sent"`, c.sent[k].Load)
		s.CounterFunc(telemetry.ClusterMessages, `kind="`+kindNames[k]+`",direction="received"`, c.received[k].Load)
	}
	for d := range numDrops {
		s.CounterFunc(telemetry.ClusterDropped, `reason="`+dropNames[d]+`"`, c.dropped[d].Load)
	}
	s.CounterFunc(telemetry.ClusterDropped, `reason="slow_consumer"`, c.slowConsumer)
	for r := range numRefusals {
		s.CounterFunc(telemetry.ClusterRefused, `reason="`+refusalNames[r]+`"`, c.refused[r].Load)
	}
	s.Register()
	c.set = s
}

// run is the publisher: every interval it sends the queued evidence and this gateway's in-flight counts and
// forgets quiet peers; between intervals it sends the evidence whenever a batch's worth is queued.
func (c *Cluster) run() {
	defer c.wg.Done()
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-c.kick:
			c.safely("evidence", c.flushEvidence)
		case <-t.C:
			c.safely("tick", c.tick)
		}
	}
}

// safely runs f, logging a panic instead of ending the process: one bad round loses that round only.
func (c *Cluster) safely(what string, f func()) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("panic in the cluster publisher", "during", what, "panic", p, "stack", string(debug.Stack()))
		}
	}()
	f()
}

func (c *Cluster) tick() {
	c.flushEvidence()
	clear(c.recent[:])
	c.publishLoad()
	c.loads.expire(time.Now())
	c.shareLimits()
}

// shareLimits makes the gateway keep its keys' and orgs' limits as one of the replicas it hears from (this
// one and its live peers), each from its share. While NATS is unreachable the share stays as it was: the
// peers still serve, so a replica that took them for gone would admit a whole limit on its own.
func (c *Cluster) shareLimits() {
	if c.connected() {
		c.g.SetLimitShare(1 + int(c.loads.live.Load()))
	}
}

// flushEvidence encodes what is queued into messages of up to batchBytes and sends them. It takes only the
// records queued when it starts, so a steady stream cannot keep it from the rest of its tick.
func (c *Cluster) flushEvidence() {
	c.pending.Store(0)
	for n := len(c.queue); n > 0; n-- {
		r := <-c.queue
		c.addRecord(&r)
	}
	c.sendBatch()
}

// addRecord appends r to the batch, sending the batch first if r would take it over batchBytes. A record
// sent already this interval (the same last checkpoint, so the same checkpoints, for the same engine) is
// skipped.
func (c *Cluster) addRecord(r *record) {
	n := int(r.n)
	if n == 0 || n > maxCheckpoints {
		return
	}
	k := entryKey(r.cps[n-1], engineKey(r.engine))
	d := &c.recent[k%dedupSlots]
	if *d == k {
		return
	}
	*d = k
	if len(c.batch)-c.hdr+recordBytes(n) > batchBytes {
		c.sendBatch()
	}
	c.batch = appendRecord(c.batch, r.engine, r.cps[:n])
}

// sendBatch sends the batch if it holds a record and starts the next.
func (c *Cluster) sendBatch() {
	if len(c.batch) <= c.hdr {
		return
	}
	c.seal(kindEvidence, c.batch)
	c.sendMsg(kindEvidence, c.batch)
	c.batch = c.appendBatchHeader(c.batch[:0])
}

// appendBatchHeader appends an evidence message's header: the envelope's room (auth.go) and the replica
// id with a key, the bare header without.
func (c *Cluster) appendBatchHeader(b []byte) []byte {
	if c.signers[signPublisher] == nil {
		return appendHeader(b, c.id)
	}
	b = append(b, make([]byte, authHeader)...)
	return binary.LittleEndian.AppendUint64(b, c.id)
}

// seal stamps an envelope (with a key; without one it does nothing) with the next timestamp, strictly
// after the last so that a receiver can refuse replays, and its MAC.
func (c *Cluster) seal(kind int, msg []byte) {
	s := c.signers[signPublisher]
	if s == nil {
		return
	}
	c.lastTS = max(time.Now().UnixNano(), c.lastTS+1)
	s.seal(kind, msg, c.lastTS)
}

// publishLoad sends this gateway's in-flight count per provider, and refreshes the provider names the
// peers' loads are kept for.
func (c *Cluster) publishLoad() {
	own := c.ownInflight()
	msg, err := json.Marshal(loadMessage{ID: c.name, Inflight: own})
	c.loads.setKnown(c.claimCaps(own))
	if err != nil {
		c.warn("cannot encode the load message", "err", err)
		return
	}
	if c.signers[signPublisher] != nil {
		msg = append(make([]byte, authHeader, authHeader+len(msg)), msg...)
		c.seal(kindLoad, msg)
	}
	c.sendMsg(kindLoad, msg)
}

// claimCaps turns the gateway's own in-flight by provider into the most one peer may claim on each:
// max_peer_inflight, or the provider's max_conns when lower (a replica of the same config cannot have
// more in flight). It reuses own.
func (c *Cluster) claimCaps(own map[string]int64) map[string]int64 {
	for name := range own {
		own[name] = c.maxPeerInflight
	}
	if mc, ok := c.g.(interface{ MaxConns(func(string, int64)) }); ok {
		mc.MaxConns(func(name string, n int64) {
			if v, ok := own[name]; ok && n > 0 && n < v {
				own[name] = n
			}
		})
	}
	return own
}

// ownInflight returns the gateway's in-flight count per provider, within a load message's bounds.
func (c *Cluster) ownInflight() map[string]int64 {
	own := make(map[string]int64)
	c.g.Inflight(func(name string, n int64) {
		if len(own) < maxProviders && name != "" && len(name) <= maxNameBytes {
			own[name] = min(max(n, 0), maxInflight)
		}
	})
	return own
}

func (c *Cluster) sendMsg(kind int, msg []byte) {
	if err := c.send(c.subjects[kind], msg); err != nil {
		c.dropped[dropPublishFailed].Add(1)
		if !errors.Is(err, errNotConnected) {
			c.warn("cannot publish", "kind", kindNames[kind], "bytes", len(msg), "err", err)
		}
		return
	}
	c.sent[kind].Add(1)
}

// publish sends msg on subject if NATS is connected. nats.go copies msg before it returns.
func (c *Cluster) publish(subject string, msg []byte) error {
	if !c.connected() {
		return errNotConnected
	}
	return c.nc.Publish(subject, msg)
}

// onEvidence is the evidence subscription's handler, the table's one writer.
func (c *Cluster) onEvidence(m *nats.Msg) {
	c.hmu.RLock()
	defer c.hmu.RUnlock()
	if c.closed {
		return
	}
	defer c.recoverMsg(kindEvidence)
	if err := c.applyEvidence(m.Data); err != nil {
		c.received[kindEvidence].Add(1)
		c.dropMsg(kindEvidence, len(m.Data), err)
	}
}

// dropMsg counts a message refused or malformed, and warns (rate-limited).
func (c *Cluster) dropMsg(kind, bytes int, err error) {
	if r := refusalOf(err); r >= 0 {
		c.refused[r].Add(1)
		c.warn("refused a message", "kind", kindNames[kind], "bytes", bytes, "reason", refusalNames[r])
		return
	}
	c.dropped[dropMalformed].Add(1)
	c.warn("dropped a malformed message", "kind", kindNames[kind], "bytes", bytes, "err", err)
}

// applyEvidence checks an evidence message from a peer (its envelope with a key, its shape, its sender's
// bounds) and inserts every checkpoint into the table, stamped now, then counts it received: whoever reads
// the count finds the evidence in the table. A replica's own messages (it hears its subject too) are
// neither applied nor counted; a refused or malformed message inserts nothing. It does not allocate, but
// for a sender's first message.
func (c *Cluster) applyEvidence(msg []byte) error {
	now := time.Now()
	ts, body, err := c.open(kindEvidence, msg, now)
	if err != nil {
		return err
	}
	from, recs, err := parseEvidenceBody(body)
	if err != nil {
		return err
	}
	if from == c.id {
		return nil
	}
	p := c.evPeers.admit(from, now)
	if p == nil {
		return refusals[refuseTooManyPeers]
	}
	if ts != 0 {
		if ts <= p.lastTS {
			return refusals[refuseReplayed]
		}
		p.lastTS = ts
	}
	if !p.bucket.take(countRecords(recs), c.evPeers.rate, now) {
		return refusals[refuseRateLimited]
	}
	stamp := c.table.now()
	r := recordReader{recs}
	for {
		engine, cps, ok := r.next()
		if !ok {
			c.received[kindEvidence].Add(1)
			return nil
		}
		ek := engineKey(engine)
		for i := 0; i+8 <= len(cps); i += 8 {
			c.table.insert(entryKey(binary.LittleEndian.Uint64(cps[i:]), ek), stamp)
		}
	}
}

// open returns the body of a message of kind and its envelope's timestamp: with a key, what a valid
// envelope holds; without one, a bare message as it is (an evidence message past its version byte), with
// timestamp 0, and an envelope is refused (bad_mac: it cannot be checked).
func (c *Cluster) open(kind int, msg []byte, now time.Time) (ts int64, body []byte, err error) {
	if s := c.signers[kind]; s != nil {
		return s.open(kind, msg, now)
	}
	if len(msg) > 0 && msg[0] == authVersion {
		return 0, nil, refusals[refuseBadMAC]
	}
	if kind == kindEvidence {
		if len(msg) == 0 || msg[0] != evidenceVersion {
			return 0, nil, errVersion
		}
		return 0, msg[1:], nil
	}
	return 0, msg, nil
}

// onLoad is the load subscription's handler.
func (c *Cluster) onLoad(m *nats.Msg) {
	c.hmu.RLock()
	defer c.hmu.RUnlock()
	if c.closed {
		return
	}
	defer c.recoverMsg(kindLoad)
	if err := c.applyLoad(m.Data); err != nil {
		c.received[kindLoad].Add(1)
		c.dropMsg(kindLoad, len(m.Data), err)
	}
}

// applyLoad checks a load message from a peer and updates the peers' loads with it, its claims cut to
// their caps, then counts it received. A replica's own messages are neither applied nor counted.
func (c *Cluster) applyLoad(msg []byte) error {
	now := time.Now()
	ts, body, err := c.open(kindLoad, msg, now)
	if err != nil {
		return err
	}
	lm, err := decodeLoad(body)
	if err != nil {
		return err
	}
	if lm.ID == c.name {
		return nil // its own
	}
	r := c.loads.update(lm, ts, now)
	if r.firstTooMany {
		c.log.Warn("ignoring the in-flight counts of peer replicas beyond the limit", "max_peers", c.loads.maxPeers)
	}
	if r.capped > 0 {
		c.refused[refuseInflightCapped].Add(uint64(r.capped))
		c.warn("cut a peer's in-flight claims to their caps", "peer", lm.ID, "claims", r.capped)
	}
	switch {
	case r.tooMany:
		return refusals[refuseTooManyPeers]
	case r.replayed:
		return refusals[refuseReplayed]
	}
	c.received[kindLoad].Add(1)
	return nil
}

// recoverMsg turns a panic while handling a message into a malformed drop: a message must not end the
// process.
func (c *Cluster) recoverMsg(kind int) {
	if p := recover(); p != nil {
		c.dropped[dropMalformed].Add(1)
		c.log.Error("panic while handling a message", "kind", kindNames[kind], "panic", p, "stack", string(debug.Stack()))
	}
}

// warn logs a warning that messages cause at most once per warnEvery, the rest at debug level.
func (c *Cluster) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	if last := c.lastWarn.Load(); now-last >= int64(warnEvery) && c.lastWarn.CompareAndSwap(last, now) {
		c.log.Warn(msg, args...)
		return
	}
	c.log.Debug(msg, args...)
}

// Connection state changes, called by nats.go one at a time; each transition is logged once.

func (c *Cluster) onConnect(nc *nats.Conn) {
	c.reconnectLogged.Store(false)
	c.authLogged.Store(false)
	c.log.Info("connected to NATS: sharing routing evidence with peer replicas", "url", nc.ConnectedUrlRedacted())
}

func (c *Cluster) onDisconnect(_ *nats.Conn, err error) {
	c.reconnectLogged.Store(false)
	c.log.Warn("disconnected from NATS: routing on local evidence until it reconnects", "err", err)
}

func (c *Cluster) onReconnect(nc *nats.Conn) {
	c.reconnectLogged.Store(false)
	c.authLogged.Store(false)
	c.log.Info("reconnected to NATS: sharing routing evidence again", "url", nc.ConnectedUrlRedacted())
}

func (c *Cluster) onReconnectErr(_ *nats.Conn, err error) {
	if isAuthError(err) {
		c.logAuthError(err)
		return
	}
	if !c.reconnectLogged.Swap(true) {
		c.log.Warn("cannot reach NATS: routing on local evidence, retrying in the background", "err", err)
		return
	}
	c.log.Debug("cannot reach NATS", "err", err)
}

// isAuthError reports whether NATS refused the credentials this replica presented (or presented none).
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// logAuthError logs once per transition that the servers refuse this replica: it keeps trying (the
// operator may fix the server's side), but a wrong credential must not look like a network problem.
func (c *Cluster) logAuthError(err error) {
	if !c.authLogged.Swap(true) {
		c.log.Error("NATS refuses this replica's credentials ([cluster] user_env/password_env, token_env, "+
			"nkey_seed_file or creds_file): routing on local evidence, retrying in the background", "err", err)
		return
	}
	c.log.Debug("NATS refuses this replica's credentials", "err", err)
}

func (c *Cluster) onAsyncError(_ *nats.Conn, s *nats.Subscription, err error) {
	if isAuthError(err) {
		c.logAuthError(err)
		return
	}
	subject := ""
	if s != nil {
		subject = s.Subject
	}
	c.warn("NATS error", "subject", subject, "err", err)
}
