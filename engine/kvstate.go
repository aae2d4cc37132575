package engine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
)

// kvState is the exact residency index of a gateway: one kvindex.Index shared by every provider with
// [providers.kv_events] that a precise_cache_aware route uses, fed by one subscription per provider, all in
// one kvindex.Subscriber: providers that bind one endpoint share its socket, told apart by topic
// (validated by kvindex.BindConflicts), and adding or removing one leaves the socket to the others. It
// outlives snapshots: a reload that keeps a provider's kv_events settings keeps its subscription, its index
// and its stream state (trusted stays trusted, no replay), and ids are stable for as long as a source lives.
// It is created when a config first needs it and stopped with the gateway. Its methods are called under
// Gateway.reloadMu; the index and streams are read concurrently by requests.
type kvState struct {
	ix      *kvindex.Index
	sub     *kvindex.Subscriber
	log     *slog.Logger
	cancel  context.CancelFunc
	used    [kvindex.MaxTargets]bool
	current map[string]*kvSource // the latest source of each provider name
}

// kvSource is one provider's subscription: its index id, its settings, its stream and metric series.
type kvSource struct {
	id   int
	name string
	cfg  config.KVEventsConfig
	// sub is cfg as subscribed (secrets read from the environment at the reload that made it): a source
	// is kept only while the new config converts to the same.
	sub   kvindex.SubscriberConfig
	st    *kvindex.Stream
	set   *telemetry.Set
	holds int // published snapshots holding it, as Provider.holds
	// registered says whether set is registered.
	registered bool
	// busyTicks and silenceDone are the silence watch's (kvsilence.go), touched by the janitor only.
	busyTicks   int
	silenceDone bool
}

func newKVState(log *slog.Logger) (*kvState, error) {
	ix := kvindex.NewIndex(kvindex.MaxTargets)
	sub, err := kvindex.NewSubscriber(ix, log.With("component", "kv_events"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sub.Start(ctx)
	return &kvState{ix: ix, sub: sub, log: log, cancel: cancel, current: map[string]*kvSource{}}, nil
}

// source returns the subscription of provider name with settings c and CURVE key curveKey: the current one when its settings are
// the same, else a new one (subscribed at once, under a free id). fresh says it was made now.
func (kv *kvState) source(name string, c *config.KVEventsConfig, curveKey string) (src *kvSource, fresh bool, err error) {
	// The same conversion the config was validated with: what passed `rolter check` is what runs.
	sc := c.SubscriberConfig(curveKey)
	if cur := kv.current[name]; cur != nil && reflect.DeepEqual(cur.sub, sc) {
		return cur, false, nil
	}
	id := -1
	for i, used := range kv.used {
		if !used {
			id = i
			break
		}
	}
	if id < 0 {
		return nil, false, fmt.Errorf("at most %d KV-event sources can be live at once (reloads still draining count too)", kvindex.MaxTargets)
	}
	st, err := kv.sub.Add(id, sc)
	if err != nil {
		return nil, false, fmt.Errorf("cannot subscribe to the KV events of provider %q: %w", name, err)
	}
	kv.used[id] = true
	src = &kvSource{id: id, name: name, cfg: *c, sub: sc, st: st, set: telemetry.NewSet()}
	registerKVMetrics(src.set, name, st)
	return src, true, nil
}

// drop ends a source no published snapshot holds any more: its subscription stops and its index is
// cleared, its id is free again.
func (kv *kvState) drop(src *kvSource) {
	kv.sub.Remove(src.id)
	kv.used[src.id] = false
	if src.registered {
		src.set.Unregister()
		src.registered = false
	}
	if kv.current[src.name] == src {
		delete(kv.current, src.name)
	}
}

func (kv *kvState) stop() {
	kv.cancel()
	kv.sub.Stop()
}

// kvEndpoints returns c with the hosts of the endpoints the subscriber connects to (the endpoint in connect
// mode, the replay endpoint) replaced by an address the egress policy checked. libzmq resolves names
// itself, at every reconnect, so it is handed the checked address instead: the policy holds for the life of
// the subscription, and a name is resolved again at each reload.
func kvEndpoints(c *config.KVEventsConfig, d *egress.Dialer) (*config.KVEventsConfig, error) {
	r := *c
	resolve := func(endpoint string) (string, error) {
		hostport, ok := strings.CutPrefix(endpoint, "tcp://")
		if !ok {
			return endpoint, nil // ipc:// and inproc:// stay on this host
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		addrs, _, port, err := d.Resolve(ctx, "tcp", hostport)
		if err != nil {
			return "", err
		}
		// libzmq connects to IPv6 only on sockets with ZMQ_IPV6 set: an IPv4 address is preferred.
		a := addrs[0]
		for _, x := range addrs {
			if x.Is4() {
				a = x
				break
			}
		}
		return "tcp://" + net.JoinHostPort(a.String(), port), nil
	}
	var err error
	if c.Mode != "bind" {
		if r.Endpoint, err = resolve(c.Endpoint); err != nil {
			return nil, err
		}
	}
	if c.ReplayEndpoint != "" {
		if r.ReplayEndpoint, err = resolve(c.ReplayEndpoint); err != nil {
			return nil, err
		}
	}
	return &r, nil
}

func registerKVMetrics(set *telemetry.Set, target string, st *kvindex.Stream) {
	l := "target=" + telemetry.Label(target)
	stat := func(f func(s *kvindex.StreamStats) float64) func() float64 {
		return func() float64 { s := st.Stats(); return f(&s) }
	}
	set.Gauge(telemetry.KVBlocks, l, stat(func(s *kvindex.StreamStats) float64 { return float64(s.Blocks) }))
	set.Gauge(telemetry.KVTrusted, l, func() float64 {
		if st.Trusted() {
			return 1
		}
		return 0
	})
	set.Gauge(telemetry.KVLastSeq, l, stat(func(s *kvindex.StreamStats) float64 { return float64(s.LastSeq) }))
	// Trust: the state as 0 exact, 1 degraded, 2 fallback, and the reason as a state set, so
	// that every series exists from the start and a change of reason is a change of value, not of labels.
	set.Gauge(telemetry.KVTrust, l, func() float64 {
		s, _ := st.Trust()
		return float64(s)
	})
	for _, r := range kvindex.TrustReasons() {
		if r == kvindex.ReasonEngineRestart {
			continue // the scraper's, never a stream's
		}
		set.Gauge(telemetry.KVTrustReason, l+",reason="+telemetry.Label(r.String()), func() float64 {
			if _, cur := st.Trust(); cur == r {
				return 1
			}
			return 0
		})
	}
	for _, e := range []struct {
		kind string
		f    func(s *kvindex.StreamStats) uint64
	}{
		{"stored", func(s *kvindex.StreamStats) uint64 { return s.StoredEvents }},
		{"removed", func(s *kvindex.StreamStats) uint64 { return s.RemovedEvents }},
		{"cleared", func(s *kvindex.StreamStats) uint64 { return s.ClearedEvents }},
		{"unknown_type", func(s *kvindex.StreamStats) uint64 { return s.SkippedEvents }},
	} {
		f := e.f
		set.CounterFunc(telemetry.KVEvents, l+",kind="+telemetry.Label(e.kind), func() uint64 { s := st.Stats(); return f(&s) })
	}
	for _, e := range []struct {
		event string
		f     func(s *kvindex.StreamStats) uint64
	}{
		{"batches", func(s *kvindex.StreamStats) uint64 { return s.Batches }},
		{"gaps", func(s *kvindex.StreamStats) uint64 { return s.Gaps }},
		{"lost_batches", func(s *kvindex.StreamStats) uint64 { return s.LostBatches }},
		{"restarts", func(s *kvindex.StreamStats) uint64 { return s.Restarts }},
		{"replays_ok", func(s *kvindex.StreamStats) uint64 { return s.ReplaysOK }},
		{"replays_failed", func(s *kvindex.StreamStats) uint64 { return s.ReplaysFailed }},
		{"decode_errors", func(s *kvindex.StreamStats) uint64 { return s.DecodeErrors }},
		{"garbage_frames", func(s *kvindex.StreamStats) uint64 { return s.GarbageFrames }},
		{"stale", func(s *kvindex.StreamStats) uint64 { return s.StaleTransitions }},
		{"missed_events", func(s *kvindex.StreamStats) uint64 { return s.MissedEvents }},
		{"unknown_parents", func(s *kvindex.StreamStats) uint64 { return s.UnknownParents }},
		{"evictions", func(s *kvindex.StreamStats) uint64 { return s.Evictions }},
		{"implausible_jumps", func(s *kvindex.StreamStats) uint64 { return s.ImplausibleJumps }},
		{"queue_drops", func(s *kvindex.StreamStats) uint64 { return s.QueueDrops }},
		{"disconnects", func(s *kvindex.StreamStats) uint64 { return s.Disconnects }},
		{"auth_refused", func(s *kvindex.StreamStats) uint64 { return s.AuthRefused }},
	} {
		f := e.f
		set.CounterFunc(telemetry.KVStream, l+",event="+telemetry.Label(e.event), func() uint64 { s := st.Stats(); return f(&s) })
	}
}
