package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/control/store"
)

// Follower keeps one gateway on the store's latest generation and reports it. With a PostgreSQL
// store shared by many gateways, a change made through any of them is committed with a notification; each
// gateway's Follower hears it (LISTEN), and Server.Sync loads the store and applies it through the same
// compose-and-Reload path as the gateway's own changes, only when the generation moved. A Follower that
// missed notifications (its connection broke, the database restarted, the gateway was cut off) catches up
// from the generation as soon as it listens again, and a check every Check catches anything else. It also
// records the gateway's served generation in the store's replicas table, shown by GET /api/v1/state.
//
// Nothing here is on the data plane: while the database is down the gateway serves its last config, and
// the Follower retries until the database is back.
type Follower struct {
	srv  *Server
	opts FollowerOptions
	log  *slog.Logger

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// FollowerOptions configure a Follower; zero fields take their defaults.
type FollowerOptions struct {
	// Address is where this gateway's control plane listens, as other replicas and operators reach it.
	Address string
	// Check is how often the store's generation is read without a notification: the safety net for a lost
	// notification, and the only way a SQLite store, which has no notifications, is followed [5s].
	Check time.Duration
	// Report is how often the replica's row is written when nothing changed [10s].
	Report time.Duration
	// Retry is the longest wait between attempts to listen again after the connection broke [1s].
	Retry  time.Duration
	Logger *slog.Logger
}

// NewFollower returns a Follower of srv's store for srv's gateway; Start starts it.
func NewFollower(srv *Server, opts FollowerOptions) *Follower {
	if opts.Check <= 0 {
		opts.Check = 5 * time.Second
	}
	if opts.Report <= 0 {
		opts.Report = 10 * time.Second
	}
	if opts.Retry <= 0 {
		opts.Retry = time.Second
	}
	log := opts.Logger
	if log == nil {
		log = srv.log
	}
	return &Follower{srv: srv, opts: opts, log: log.With("component", "control", "replica", srv.replicaID)}
}

// Start starts following. It returns at once; the first catch-up runs in the background.
func (f *Follower) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer func() {
			if p := recover(); p != nil {
				f.log.Error("BUG: the store follower panicked; this gateway no longer follows the store", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
		}()
		f.run(ctx)
	}()
}

// Stop stops following and waits for the follower to end.
func (f *Follower) Stop() {
	if f.cancel == nil {
		return
	}
	f.cancel()
	f.wg.Wait()
}

// run listens, catches up and reports until ctx ends.
func (f *Follower) run(ctx context.Context) {
	st := followState{f: f}
	var l *store.Listener
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	retry := 50 * time.Millisecond
	for ctx.Err() == nil {
		if l == nil && f.srv.store.Postgres() {
			var err error
			if l, err = f.srv.store.Listen(ctx); err != nil {
				st.failed(err)
				l = nil
			} else {
				retry = 50 * time.Millisecond
			}
		}
		// After (re)connecting, on a notification or a check: whatever was missed, the generation tells.
		st.sync(ctx)
		if l == nil && f.srv.store.Postgres() {
			// Not listening: try again soon, with a backoff up to opts.Retry.
			sleep(ctx, retry)
			retry = min(2*retry, f.opts.Retry)
			continue
		}
		if l == nil {
			sleep(ctx, f.opts.Check) // SQLite: nothing to hear, the check alone
			continue
		}
		if _, err := l.Wait(ctx, f.opts.Check); err != nil && ctx.Err() == nil {
			st.failed(fmt.Errorf("cannot listen for changes: %w", err))
			l.Close()
			l = nil
		}
	}
}

// syncTimeout bounds one Sync and report.
const syncTimeout = 10 * time.Second

// followState is what run remembers between syncs: when it last reported, and whether the store was
// unreachable (logged once per outage, not once per attempt).
type followState struct {
	f        *Follower
	reported time.Time
	gen      int64  // the generation last reported
	refused  string // the refusal last reported
	down     bool
}

// sync applies the store if it moved, and reports the replica when its generation changed or Report
// passed.
func (st *followState) sync(ctx context.Context) {
	f := st.f
	// A database behind a cut network can hang a query past any connect timeout: Sync holds the server's
	// write lock, so it gives up first.
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	start := time.Now()
	applied, err := f.srv.Sync(ctx)
	switch {
	case errors.Is(err, store.ErrUnavailable):
		st.failed(err)
		return
	case err != nil:
		f.log.Error("cannot apply the store's latest generation; the gateway keeps serving the one it has", "error", err.Error())
	case applied:
		gen, _ := f.srv.Applied()
		f.log.Info("applied a change of the store", "generation", gen, "took", time.Since(start).Round(time.Microsecond).String())
	}
	st.up()
	gen, refused := f.srv.Applied()
	if gen == st.gen && refused == st.refused && time.Since(st.reported) < f.opts.Report {
		return
	}
	err = f.srv.store.ReportReplica(ctx, store.Replica{ID: f.srv.replicaID, Address: f.opts.Address, Version: f.srv.version, Generation: gen, Error: refused})
	if err != nil {
		st.failed(err)
		return
	}
	st.reported, st.gen, st.refused = time.Now(), gen, refused
}

// failed logs that the store cannot be reached, once per outage; other errors every time.
func (st *followState) failed(err error) {
	if !errors.Is(err, store.ErrUnavailable) {
		st.f.log.Error("the store follower failed", "error", err.Error())
		return
	}
	if !st.down {
		st.down = true
		st.f.log.Warn("the store cannot be reached; the gateway keeps serving its last config and retries", "error", err.Error())
	}
}

func (st *followState) up() {
	if st.down {
		st.down = false
		st.f.log.Info("the store can be reached again")
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// defaultReplicaID is "<host name>/<process id>": a pod's name in Kubernetes, unique per process
// elsewhere.
func defaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}
