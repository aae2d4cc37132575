package telemetry

import "github.com/VictoriaMetrics/metrics"

// The metrics of a prefill/decode-disaggregated route ([routes.disaggregation]).
const (
	mDisaggHops     = "rolter_disagg_hops_total"            // {route,hop,outcome} hop = prefill | decode, outcome = ok | failed
	mDisaggParams   = "rolter_disagg_kv_params_total"       // {route,result} what prefill answers carried
	mDisaggSkipped  = "rolter_disagg_prefill_skipped_total" // {route,reason} requests a decode engine prefilled itself
	mDisaggRefilled = "rolter_disagg_reprefills_total"      // {route} fresh prefills after a decode failed with the blocks
)

// KV-params results, the result label of rolter_disagg_kv_params_total.
var DisaggParamResults = []string{"received", "absent", "invalid"}

// Skip reasons, the reason label of rolter_disagg_prefill_skipped_total.
var DisaggSkipReasons = []string{"short_prompt", "endpoint", "prefill_failed"}

// DisaggMetrics are the handles of one disaggregated route.
type DisaggMetrics struct {
	PrefillOK, PrefillFailed *metrics.Counter
	DecodeOK, DecodeFailed   *metrics.Counter
	params, skipped          *lazyCounters
	Reprefills               *metrics.Counter
}

// NewDisaggMetrics creates the handles for the disaggregated route of that name.
func (s *Set) NewDisaggMetrics(route string) *DisaggMetrics {
	l := "route=" + Label(route)
	hop := func(h, outcome string) *metrics.Counter {
		return s.s.NewCounter(mDisaggHops + "{" + l + `,hop="` + h + `",outcome="` + outcome + `"}`)
	}
	return &DisaggMetrics{
		PrefillOK: hop("prefill", "ok"), PrefillFailed: hop("prefill", "failed"),
		DecodeOK: hop("decode", "ok"), DecodeFailed: hop("decode", "failed"),
		params:     newLazyCounters(s.s, mDisaggParams, l, "result", DisaggParamResults),
		skipped:    newLazyCounters(s.s, mDisaggSkipped, l, "reason", DisaggSkipReasons),
		Reprefills: s.s.NewCounter(mDisaggRefilled + "{" + l + "}"),
	}
}

// Params counts a prefill answer by what its kv_transfer_params were (an index of DisaggParamResults).
func (m *DisaggMetrics) Params(result int) { m.params.Inc(result) }

// ParamCounts returns the prefill answers so far by what their kv_transfer_params were.
func (m *DisaggMetrics) ParamCounts() map[string]uint64 { return m.params.Values() }

// SkipCounts returns the requests sent to a decode engine without a prefill so far, by reason.
func (m *DisaggMetrics) SkipCounts() map[string]uint64 { return m.skipped.Values() }

// Skipped counts a request sent to a decode engine without a prefill, by reason (DisaggSkipReasons).
func (m *DisaggMetrics) Skipped(reason int) { m.skipped.Inc(reason) }
