package discovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
)

// Options configure a Fleet.
type Options struct {
	// NewWatcher makes the watcher of one source (the gateway's table of kinds: kubesrc, dnssrc).
	NewWatcher func(sc *config.SourceConfig) (Watcher, error)
	Logger     *slog.Logger
	// Interval is the least time between two configs applied because sources changed: changes that come
	// faster are coalesced into one (default 100 ms).
	Interval time.Duration
	// SyncWait bounds how long a new source is waited for before a config that names it is applied
	// without its endpoints (default 5 s).
	SyncWait time.Duration
}

// Fleet keeps a gateway's config in step with its sources: it expands every config it is given (Prepare,
// Apply) with the endpoints the sources find, and applies it again whenever they change. A target that
// stays keeps its name, so the gateway carries over its trie, sessions, KV index, counters and health; one
// that goes is dropped, and its streams finish.
type Fleet struct {
	opts Options
	log  *slog.Logger

	applyMu sync.Mutex // one expansion applied at a time
	apply   func(*config.Config) error
	base    *config.Config
	policy  *egress.Policy
	sources map[string]*watched
	applied string // the key of the discovered part last applied
	last    time.Time
	took    time.Duration // how long the last apply took

	statusMu sync.Mutex
	views    map[string][]EndpointStatus
	applyErr string
	running  map[string]*watched // f.sources, for Status

	// egress is the [egress] policy of the config being applied or last applied, which Dial and Check
	// use: a change of policy reaches running watchers.
	egress atomic.Pointer[egress.Policy]

	kickc chan struct{}
	stopc chan struct{}
	loop  chan struct{}
	once  sync.Once
}

// New returns a Fleet with no sources; Prepare gives it its first config.
func New(opts Options) *Fleet {
	if opts.Interval <= 0 {
		opts.Interval = 100 * time.Millisecond
	}
	if opts.SyncWait <= 0 {
		opts.SyncWait = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Fleet{opts: opts, log: opts.Logger, sources: map[string]*watched{}, kickc: make(chan struct{}, 1),
		stopc: make(chan struct{}), loop: make(chan struct{})}
}

// Prepare starts the sources of base, waits (within SyncWait) for their first report, and returns base
// expanded with what they found: the config to start the gateway with. Attach then hands the Fleet the
// gateway's Reload.
func (f *Fleet) Prepare(base *config.Config) (*config.Config, error) {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	return f.change(base, nil)
}

// Attach gives the Fleet the function that applies a config (the gateway's Reload) and starts following
// the sources.
func (f *Fleet) Attach(apply func(*config.Config) error) {
	f.applyMu.Lock()
	f.apply = apply
	f.applyMu.Unlock()
	go f.follow()
	f.kick()
}

// Apply applies base (a new file config, or one the control plane composed), expanded: sources it adds
// start and are waited for, sources it drops stop once the config is applied. If the config is refused,
// nothing changes and the error says why.
func (f *Fleet) Apply(base *config.Config) error {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	if f.apply == nil {
		return errors.New("BUG: discovery.Fleet.Apply before Attach")
	}
	_, err := f.change(base, f.apply)
	return err
}

// change expands base with the sources it names (started when new or changed, the others kept) and,
// when apply is not nil, applies it. On success base and its sources become the fleet's; on failure the
// sources it started are stopped. f.applyMu is held.
func (f *Fleet) change(base *config.Config, apply func(*config.Config) error) (*config.Config, error) {
	policy, _ := egress.New(base.Egress) // a bad [egress] fails validation, with its reason
	prev := f.egress.Swap(policy)
	next, started, err := f.reconcile(base)
	if err != nil {
		f.egress.Store(prev)
		return nil, err
	}
	f.waitSynced(started)
	x := expand(base, next, policy, time.Now())
	if apply != nil {
		err = apply(x.cfg)
	}
	if err != nil {
		f.egress.Store(prev)
		for _, w := range started {
			w.cancel()
			<-w.done
		}
		return nil, err
	}
	for name, w := range f.sources {
		if next[name] != w {
			w.cancel()
			<-w.done
		}
	}
	f.base, f.policy, f.sources, f.applied, f.last = base, policy, next, x.key, time.Now()
	f.publish(x, "")
	return x.cfg, nil
}

// reconcile returns the sources base names: the running ones whose settings are the same, new watchers
// for the others (started, and carrying the set of the source they replace until they report).
func (f *Fleet) reconcile(base *config.Config) (map[string]*watched, []*watched, error) {
	next := make(map[string]*watched, len(base.Sources))
	var started []*watched
	for i := range base.Sources {
		sc := &base.Sources[i]
		if w := f.sources[sc.Name]; w != nil && reflect.DeepEqual(w.cfg, *sc) {
			next[sc.Name] = w
			continue
		}
		watcher, err := f.opts.NewWatcher(sc)
		if err != nil {
			for _, w := range started {
				w.cancel()
				<-w.done
			}
			return nil, nil, &StartError{Source: sc.Name, Err: err}
		}
		w := newWatched(sc, f.kick)
		if old := f.sources[sc.Name]; old != nil {
			w.carry(old)
		}
		ctx, cancel := context.WithCancel(context.Background())
		w.cancel = cancel
		go func() {
			defer close(w.done)
			watcher.Watch(ctx, w)
		}()
		next[sc.Name] = w
		started = append(started, w)
	}
	return next, started, nil
}

// waitSynced waits until every watcher of ws has reported once, or SyncWait passed.
func (f *Fleet) waitSynced(ws []*watched) {
	timeout := time.NewTimer(f.opts.SyncWait)
	defer timeout.Stop()
	for _, w := range ws {
		select {
		case <-w.synced:
		case <-timeout.C:
			f.log.Warn("a discovery source has not reported yet; its routes start without its endpoints", "source", w.cfg.Name,
				"waited", f.opts.SyncWait.String())
			return
		}
	}
}

func (f *Fleet) kick() {
	select {
	case f.kickc <- struct{}{}:
	default:
	}
}

// follow applies the expanded config again whenever a source reports a change or a settling endpoint
// becomes live, at most once per Interval.
func (f *Fleet) follow() {
	defer close(f.loop)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-f.kickc:
		case <-timer.C:
		case <-f.stopc:
			return
		}
		f.applyMu.Lock()
		// Changes are applied at most every Interval, and at most a fifth of the time goes to applying
		// them however large the fleet is.
		wait := time.Until(f.last.Add(max(f.opts.Interval, 4*f.took)))
		f.applyMu.Unlock()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-f.stopc:
				return
			}
		}
		next := f.reapply()
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

// reapply expands the fleet's base with what its sources see now and applies it if the discovered part
// changed. It returns when a settling endpoint becomes live.
func (f *Fleet) reapply() time.Time {
	f.applyMu.Lock()
	defer f.applyMu.Unlock()
	if f.apply == nil || f.base == nil {
		return time.Time{}
	}
	x := expand(f.base, f.sources, f.policy, time.Now())
	if x.key == f.applied {
		f.publish(x, f.applyErrText())
		return x.next
	}
	f.last = time.Now()
	msg := ""
	err := f.apply(x.cfg)
	f.took = time.Since(f.last)
	if err != nil {
		msg = err.Error()
		f.log.Error("the config with the discovered endpoints was refused; the last one keeps serving", "error", msg)
	} else {
		f.applied = x.key
	}
	f.publish(x, msg)
	return x.next
}

func (f *Fleet) applyErrText() string {
	f.statusMu.Lock()
	defer f.statusMu.Unlock()
	return f.applyErr
}

// publish records x's endpoint states and the last apply's error for Status.
func (f *Fleet) publish(x *expansion, applyErr string) {
	f.statusMu.Lock()
	f.views, f.applyErr, f.running = x.endpoints, applyErr, f.sources
	f.statusMu.Unlock()
}

// Dial connects under the fleet's [egress] policy: what sources reach their servers with (a DNS
// resolver), so the policy covers them as it covers the engines.
func (f *Fleet) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d := egress.Dialer{Policy: f.egress.Load()}
	return d.DialContext(ctx, network, addr)
}

// Check is the fleet's [egress] policy's CheckAddr (nil: every address is allowed).
func (f *Fleet) Check(name string, a netip.Addr) error {
	if p := f.egress.Load(); p != nil {
		return p.CheckAddr(name, a)
	}
	return nil
}

// Close stops every source and the following.
func (f *Fleet) Close() {
	f.once.Do(func() { close(f.stopc) })
	f.applyMu.Lock()
	attached := f.apply != nil
	for _, w := range f.sources {
		w.cancel()
		<-w.done
	}
	f.sources = map[string]*watched{}
	f.applyMu.Unlock()
	if attached {
		<-f.loop
	}
}

// StartError is a source that cannot start (a kubeconfig that does not load, say): the config that names
// it is refused before the gateway sees it.
type StartError struct {
	Source string
	Err    error
}

func (e *StartError) Error() string {
	return fmt.Sprintf("cannot start source %q: %s", e.Source, e.Err)
}

func (e *StartError) Unwrap() error { return e.Err }
