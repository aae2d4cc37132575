package overhead

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/telemetry"
)

// TrieStats is the cache_aware Rolter's routing memory, from its /metrics: its tries summed over the
// targets after the warm-up and after the rounds.
type TrieStats struct {
	// Filled: the warm-up went on until the tries evicted, which took FillSeconds and FillRequests.
	Filled       bool         `json:"filled"`
	FillSeconds  float64      `json:"fill_seconds"`
	FillRequests int64        `json:"fill_requests"`
	AfterFill    TrieSnapshot `json:"after_fill"`
	AfterRounds  TrieSnapshot `json:"after_rounds"`
}

// TrieSnapshot is one read of a route's trie and decision metrics, summed over its targets.
type TrieSnapshot struct {
	Prompts   float64 `json:"prompts"`
	Nodes     float64 `json:"nodes"`
	EdgeMiB   float64 `json:"edge_mib"`
	ArenaMiB  float64 `json:"arena_mib"`
	Evictions float64 `json:"evictions"`
	// Decisions are rolter_decisions_total by decision (prefix_hit, no_match, ...).
	Decisions map[string]float64 `json:"decisions"`
}

// fill sends unique prompts through u (the cache_aware case's Rolter) until its tries evict, for at most
// FillTimeout, so that the rounds measure tries that insert and evict as a long-running gateway's do. A
// route without tries is left as it is.
func (r *harness) fill(ctx context.Context, u unit, seq *atomic.Uint64) (*TrieStats, error) {
	ts := &TrieStats{}
	start := time.Now()
	for {
		snap, err := r.trieSnapshot(u)
		if err != nil {
			return nil, err
		}
		ts.AfterFill = snap
		if snap.Evictions > 0 {
			ts.Filled = true
			break
		}
		if snap.Nodes == 0 && snap.ArenaMiB == 0 {
			break // the route keeps no tries (another strategy, bench/cmd/ab -strategy-b): nothing to fill
		}
		left := r.o.FillTimeout - time.Since(start)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		t := r.throughput(ctx, u, r.o.ThroughputConcurrency, min(left, 500*time.Millisecond), seq)
		ts.FillRequests += t.count
	}
	ts.FillSeconds = time.Since(start).Seconds()
	return ts, ctx.Err()
}

// trieSnapshot reads u's Rolter /metrics for the tries and decisions of u's route.
func (r *harness) trieSnapshot(u unit) (TrieSnapshot, error) {
	return readTrieSnapshot(r.addrs[u.key()], u.key(), u.c.Model)
}

// ReadTrieSnapshot reads the trie figures of case c's route from the gateway listening on addr.
func ReadTrieSnapshot(addr string, c *Case) (TrieSnapshot, error) {
	return readTrieSnapshot(addr, unit{c, PathRolter}.key(), c.Model)
}

// readTrieSnapshot reads the trie figures of route from the gateway on addr; name is the gateway's name in errors.
func readTrieSnapshot(addr, name, route string) (TrieSnapshot, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: status %d: %.200s", name, resp.StatusCode, body)
	}
	return parseTrieMetrics(body, route), nil
}

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// parseTrieMetrics sums the trie gauges and counters of route over its targets, and its decisions.
func parseTrieMetrics(body []byte, route string) TrieSnapshot {
	s := TrieSnapshot{Decisions: map[string]float64{}}
	var sc telemetry.Scanner
	sc.Init(body)
	for sc.Next() {
		x := sc.Sample()
		if l, ok := x.Label("route"); !ok || string(l) != route {
			continue
		}
		switch string(x.Name) {
		case telemetry.TriePrompts:
			s.Prompts += x.Value
		case telemetry.TrieNodes:
			s.Nodes += x.Value
		case telemetry.TrieEdgeBytes:
			s.EdgeMiB += x.Value / (1 << 20)
		case telemetry.TrieArenaBytes:
			s.ArenaMiB += x.Value / (1 << 20)
		case telemetry.TrieEvictions:
			s.Evictions += x.Value
		case "rolter_decisions_total":
			if d, ok := x.Label("decision"); ok {
				s.Decisions[string(d)] += x.Value
			}
		}
	}
	return s
}
