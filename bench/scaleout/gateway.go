package scaleout

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/rolter-ai/rolter/telemetry"
)

// gatewayStats is what one gateway's /metrics counted.
type gatewayStats struct {
	Requests     int // rolter_requests_total, every route, target and code
	PromptTokens float64
	CachedTokens float64
	KVEvents     int // rolter_kv_events_total, every target and kind
	KVTargets    int // targets with at least one KV event
}

func (s gatewayStats) hitRate() float64 {
	if s.PromptTokens == 0 {
		return 0
	}
	return s.CachedTokens / s.PromptTokens
}

// scrapeGateway reads a gateway's /metrics.
func scrapeGateway(ctx context.Context, base string) (gatewayStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: %w", base, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return gatewayStats{}, fmt.Errorf("cannot read the metrics of %q: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return gatewayStats{}, fmt.Errorf("cannot scrape %q: status %d", base, resp.StatusCode)
	}
	return parseGatewayMetrics(body), nil
}

// parseGatewayMetrics sums the counters the report reads from a gateway's exposition.
func parseGatewayMetrics(body []byte) gatewayStats {
	var st gatewayStats
	kvTargets := map[string]bool{}
	var sc telemetry.Scanner
	sc.Init(body)
	for sc.Next() {
		s := sc.Sample()
		switch string(s.Name) {
		case "rolter_requests_total":
			st.Requests += int(s.Value)
		case "rolter_prompt_tokens_total":
			st.PromptTokens += s.Value
		case "rolter_cached_tokens_total":
			st.CachedTokens += s.Value
		case "rolter_kv_events_total":
			st.KVEvents += int(s.Value)
			if t, ok := s.Label("target"); ok && s.Value > 0 {
				kvTargets[string(t)] = true
			}
		}
	}
	st.KVTargets = len(kvTargets)
	return st
}
