package config

// DisaggregationConfig is [routes.disaggregation]: the route serves a prefill/decode-disaggregated fleet.
// The route's targets are then its prefill pool - the engines that hold the prompt cache, ranked by the
// route's strategy - and Decode its decode pool, chosen by load. Each request is prefilled on one engine
// of the first and generated on one of the second, which receives the prompt's KV blocks from it
// (docs/routing/disaggregation.md).
type DisaggregationConfig struct {
	// Protocol is how the two engines are paired: "vllm" (the NixlConnector's kv_transfer_params, the
	// prefill first and the decode after it) or "sglang" (bootstrap host, port and room, both at once).
	Protocol string `toml:"protocol" json:"protocol"`
	// Decode is the decode pool: targets as in the route's list (a provider or a source, a model, a weight).
	Decode []TargetConfig `toml:"decode" json:"decode"`
	// PrefillThresholdTokens makes disaggregation selective: a request whose prompt is shorter than this
	// many tokens (four bytes of the prompt key per token) skips the prefill engine, and its decode engine
	// prefills it locally. The decode engines' caches are not tracked, so the whole prompt counts as what
	// the decode engine would compute. 0 sends every request through a prefill engine. vllm only: an
	// SGLang decode server cannot prefill without its peer.
	PrefillThresholdTokens *int `toml:"prefill_threshold_tokens" json:"prefill_threshold_tokens,omitempty"`
	// BootstrapPort is the prefill engines' bootstrap port (SGLang's --disaggregation-bootstrap-port);
	// 0 sends null, as SGLang's router does for a worker without one. sglang only.
	BootstrapPort *int `toml:"bootstrap_port" json:"bootstrap_port,omitempty"`
	// DecodeDiscovered names the sources whose endpoints are among Decode (set by the discovery Fleet).
	DecodeDiscovered []string `toml:"-" json:"-"`
}

// Disaggregation protocols.
const (
	ProtocolVLLM   = "vllm"
	ProtocolSGLang = "sglang"
)

// Defaults of [routes.disaggregation].
const (
	// DefaultPrefillThresholdTokens is the selective-disaggregation threshold: 0, every request through a
	// prefill engine, as vLLM's proxy and SGLang's routers send them. What a prefill hop saves a short
	// prompt is the decode engines' freedom from prefills, which the simulator does not model (a hop only
	// adds 3-17 ms to an idle simulated fleet at any length: bench/results/disagg-threshold.md), so the
	// threshold is the operator's to measure on real engines.
	DefaultPrefillThresholdTokens = 0
	// DefaultBootstrapPort is SGLang's default --disaggregation-bootstrap-port.
	DefaultBootstrapPort = 8998
	// BytesPerToken is the prompt key's bytes per token the threshold is estimated with.
	BytesPerToken = 4
)

func (d *DisaggregationConfig) setDefaults(r *RouteConfig) {
	if d.Protocol == "" {
		d.Protocol = ProtocolVLLM
	}
	if d.PrefillThresholdTokens == nil {
		n := DefaultPrefillThresholdTokens
		d.PrefillThresholdTokens = &n
	}
	if d.BootstrapPort == nil && d.Protocol == ProtocolSGLang {
		n := DefaultBootstrapPort
		d.BootstrapPort = &n
	}
	setTargetDefaults(r, d.Decode)
}
