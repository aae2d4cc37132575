package discovery

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/telemetry"
)

// Status is what one source sees and how it fares, for GET /api/v1/state, the dashboard and /metrics.
type Status struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// Up reports that the source's last report was its set; when it is false, LastError says why and the
	// last set stands.
	Up          bool       `json:"up"`
	Syncs       uint64     `json:"syncs"`
	LastSync    *time.Time `json:"last_sync,omitempty"`
	Errors      uint64     `json:"errors"`
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	// ApplyError is why the gateway refused the last config with the discovered endpoints ("" when it
	// took it).
	ApplyError string `json:"apply_error,omitempty"`
	// Counts of Endpoints by state (StateLive, ...).
	States    map[string]int   `json:"states"`
	Endpoints []EndpointStatus `json:"endpoints"`
}

// Status returns every source's status, by name. It never waits for a config being applied.
func (f *Fleet) Status() []Status {
	f.statusMu.Lock()
	views, applyErr, running := f.views, f.applyErr, f.running
	f.statusMu.Unlock()
	out := make([]Status, 0, len(running))
	for name, w := range running {
		w.mu.Lock()
		c := w.counters
		w.mu.Unlock()
		st := Status{Name: name, Kind: w.cfg.Kind, Up: c.syncs > 0 && !c.failing, Syncs: c.syncs, Errors: c.errors,
			LastError: c.lastError, ApplyError: applyErr, States: map[string]int{}, Endpoints: views[name]}
		if !c.lastSync.IsZero() {
			st.LastSync = &c.lastSync
		}
		if !c.lastErrorAt.IsZero() {
			st.LastErrorAt = &c.lastErrorAt
		}
		if st.Endpoints == nil {
			st.Endpoints = []EndpointStatus{}
		}
		for _, e := range st.Endpoints {
			st.States[e.State]++
		}
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Metric names of the sources.
const (
	mSourceUp        = "rolter_discovery_source_up"                   // gauge: 1 when the last report was a set
	mSourceEndpoints = "rolter_discovery_endpoints"                   // gauge {source, state}
	mSourceSyncs     = "rolter_discovery_syncs_total"                 // sets reported
	mSourceErrors    = "rolter_discovery_errors_total"                // failures reported
	mSourceLastSync  = "rolter_discovery_last_sync_timestamp_seconds" // gauge, unix seconds
	mApplyFailed     = "rolter_discovery_apply_failed"                // gauge: 1 when the last expanded config was refused
)

var allStates = []string{StateLive, StateSettling, StateNotReady, StateTerminating, StateCapped, StateRefused}

// RegisterMetrics exports the sources' series on /metrics until the returned function is called.
func (f *Fleet) RegisterMetrics() (unregister func()) {
	set := telemetry.NewSet()
	set.Inner().RegisterMetricsWriter(f.writeMetrics)
	set.Register()
	return set.Unregister
}

// writeMetrics writes the sources' series in the Prometheus text format.
func (f *Fleet) writeMetrics(w io.Writer) {
	sts := f.Status()
	if len(sts) == 0 {
		return
	}
	family := func(name, typ string, each func(s *Status, l string)) {
		fmt.Fprintf(w, "# HELP %s\n# TYPE %s %s\n", name, name, typ)
		for i := range sts {
			each(&sts[i], "source="+telemetry.Label(sts[i].Name))
		}
	}
	family(mSourceUp, "gauge", func(s *Status, l string) { fmt.Fprintf(w, "%s{%s} %d\n", mSourceUp, l, b2i(s.Up)) })
	family(mSourceEndpoints, "gauge", func(s *Status, l string) {
		for _, state := range allStates {
			fmt.Fprintf(w, "%s{%s,state=%q} %d\n", mSourceEndpoints, l, state, s.States[state])
		}
	})
	family(mSourceSyncs, "counter", func(s *Status, l string) { fmt.Fprintf(w, "%s{%s} %d\n", mSourceSyncs, l, s.Syncs) })
	family(mSourceErrors, "counter", func(s *Status, l string) { fmt.Fprintf(w, "%s{%s} %d\n", mSourceErrors, l, s.Errors) })
	family(mSourceLastSync, "gauge", func(s *Status, l string) {
		ts := int64(0)
		if s.LastSync != nil {
			ts = s.LastSync.Unix()
		}
		fmt.Fprintf(w, "%s{%s} %d\n", mSourceLastSync, l, ts)
	})
	fmt.Fprintf(w, "# HELP %s\n# TYPE %s gauge\n%s %d\n", mApplyFailed, mApplyFailed, mApplyFailed, b2i(sts[0].ApplyError != ""))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
