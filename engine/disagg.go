package engine

import (
	"math/rand/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/telemetry"
)

// pdRoute is what a prefill/decode-disaggregated route ([routes.disaggregation]) adds to its Route: the
// route's Targets are its prefill pool, ranked by its strategy, and decode its decode pool, chosen by
// load (pickDecode). The request's two hops are in disagg_call.go (docs/routing/disaggregation.md).
type pdRoute struct {
	sglang bool
	decode []*Target
	// thresholdBytes is prefill_threshold_tokens in prompt-key bytes: a shorter prompt skips the prefill.
	thresholdBytes int
	bootstrapPort  uint16
	m              *telemetry.DisaggMetrics
}

// newPDRoute makes the disaggregated part of route r from its config; target makes each decode target.
func newPDRoute(dc *config.DisaggregationConfig, m *telemetry.DisaggMetrics, target func(j int, tc config.TargetConfig) *Target) *pdRoute {
	pd := &pdRoute{
		sglang:         dc.Protocol == config.ProtocolSGLang,
		thresholdBytes: *dc.PrefillThresholdTokens * config.BytesPerToken,
		m:              m,
	}
	if dc.BootstrapPort != nil {
		pd.bootstrapPort = uint16(*dc.BootstrapPort)
	}
	for j, tc := range dc.Decode {
		pd.decode = append(pd.decode, target(j, tc))
	}
	return pd
}

// pickDecode returns the decode target for the next decode attempt: of the eligible targets not tried yet
// (tried: a bit per decode target), the one with the least in flight per unit of weight, ties broken from
// a random start so that an idle pool spreads a burst; when none is eligible and failOpen is set, the same
// over every untried target. -1 when none is left.
func (pd *pdRoute) pickDecode(tried uint64, now int64, failOpen bool) int {
	n := len(pd.decode)
	if n == 0 {
		return -1
	}
	start := int(rand.Uint32N(uint32(n)))
	best := -1
	var bestLoad float64
	for pass := 0; pass < 2 && best < 0; pass++ {
		if pass == 1 && !failOpen {
			break
		}
		for k := range n {
			i := (start + k) % n
			t := pd.decode[i]
			if tried&(1<<i) != 0 || pass == 0 && !t.Provider.health.eligible(now) {
				continue
			}
			if l := float64(t.Load()) / t.Weight; best < 0 || l < bestLoad {
				best, bestLoad = i, l
			}
		}
	}
	return best
}
