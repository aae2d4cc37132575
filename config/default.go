package config

import (
	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/tracing"
)

// Default returns a config with every section default (configs/rolter.example.toml lists them) and no
// providers or routes. TOML decoding starts from it, so a key a file leaves out keeps its default; the
// defaults of the keys inside arrays of tables ([[providers]], [[routes]]) are filled by SetDefaults.
func Default() *Config {
	return &Config{
		Server: ServerConfig{
			Listen:                ":8080",
			MaxBodyBytes:          16 << 20,
			MaxHeaderBytes:        64 << 10,
			MaxBodyMemoryBytes:    1 << 30,
			RoutingMemoryBytes:    512 << 20,
			ReadTimeoutSecs:       60,
			IdleTimeoutSecs:       60,
			DrainSecs:             30,
			ExposeDecisionHeaders: true,
			ExposeMetrics:         true,
			TLSMinVersion:         "1.2",
		},
		MetricsScrape: ScrapeConfig{IntervalSecs: 0.5, TimeoutSecs: 0.5, Path: "/metrics"},
		Health: HealthConfig{
			Path: "/health", IntervalSecs: 2, TimeoutSecs: 1, UnhealthyThreshold: 2, HealthyThreshold: 2, FailOpen: true,
			MaxEjectionPercent: 50,
		},
		Cooldown: CooldownConfig{
			Enabled: true, Failures: 3, WindowSecs: 10, BaseSecs: 5, MaxSecs: 60, MaxRetryAfterSecs: 60, Consecutive5xx: 5,
		},
		Breaker:  BreakerConfig{Enabled: true, Failures: 5, OpenSecs: 10, HalfOpenProbes: 1},
		Retry:    RetryConfig{MaxRetries: 2, BackoffMs: 25, MaxBackoffMs: 500},
		Timeouts: TimeoutsConfig{ConnectSecs: 5, HeadersSecs: 600, IdleSecs: 120},
		Queue:    QueueConfig{WaitTimeoutSecs: 5, RetryAfterSecs: 1},
		Egress:   egress.DefaultConfig(),
		Control: ControlConfig{Listen: "127.0.0.1:8081", Store: "rolter.db", AdminTokenEnv: "ROLTER_ADMIN_TOKEN",
			MaxConns: 64, ReadTimeoutSecs: 10, WriteTimeoutSecs: 60, IdleTimeoutSecs: 60, Quotas: DefaultQuotas,
			TLSMinVersion: "1.2"},
		Cluster: ClusterConfig{Subject: "rolter", PublishIntervalMs: 20, MaxEntries: 1 << 20, EvidenceTTLSecs: 600,
			QueueSize: 4096, MaxPeers: 64, MaxPeerInflight: 1024, PeerEvidencePerSec: 50000},
		Trace:   TraceConfig{MaxBytes: 100 << 20, Keep: 5, BlockBytes: capture.DefaultBlockBytes, QueueSize: 4096},
		Log:     accesslog.DefaultConfig(),
		Tracing: tracing.DefaultConfig(),
	}
}

// Provider kinds.
const kindOpenAICompatible = "openai_compatible"

// Defaults of the keys inside arrays of tables, filled by SetDefaults (configs/rolter.example.toml lists
// them too). A target's model defaults to its route's model.
const (
	defaultProviderMaxConns   = 1024
	defaultKVMode             = "connect"
	defaultKVMaxBlocks        = 1_000_000
	defaultKVStaleSecs        = 30.0
	defaultLMCacheRefreshSecs = 2.0
	defaultLMCacheStaleSecs   = 10.0
	defaultStrategy           = "round_robin"
	defaultTargetWeight       = 1.0
)

// SetDefaults fills every default cfg lacks; validation runs after it and only checks. The sections start
// complete (decoding starts from Default); an element of [[providers]] or [[routes]] starts from zero
// and gets its defaults here. Only zero values are filled, so setting the defaults of a config that has
// them changes nothing: the engine's Reload sets them again on a config Parse returned.
func (cfg *Config) SetDefaults() {
	if cfg.Limits.DefaultMaxTokens == nil {
		n := int64(DefaultMaxTokensReserved)
		cfg.Limits.DefaultMaxTokens = &n
	}
	cfg.Log.SetDefaults()
	cfg.Tracing.SetDefaults()
	for i := range cfg.Providers {
		cfg.Providers[i].setDefaults()
	}
	for i := range cfg.Sources {
		cfg.Sources[i].setDefaults()
	}
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		if r.Strategy == "" {
			r.Strategy = defaultStrategy
		}
		setTargetDefaults(r, r.Targets)
		if r.Disaggregation != nil {
			r.Disaggregation.setDefaults(r)
		}
		if r.LoRA != nil {
			r.LoRA.setDefaults()
		}
	}
}

// setTargetDefaults fills the zero keys of targets, a pool of route r.
func setTargetDefaults(r *RouteConfig, targets []TargetConfig) {
	for j := range targets {
		t := &targets[j]
		if t.Model == "" {
			t.Model = r.Model
		}
		if t.Weight == nil {
			w := defaultTargetWeight
			t.Weight = &w
		}
	}
}

// setDefaults fills the zero keys of p.
func (p *ProviderConfig) setDefaults() {
	if p.Kind == "" {
		p.Kind = kindOpenAICompatible
	}
	if p.MaxConns == 0 {
		p.MaxConns = defaultProviderMaxConns
	}
	if kv := p.KVEvents; kv != nil {
		if kv.Mode == "" {
			kv.Mode = defaultKVMode
		}
		if kv.MaxBlocks == 0 {
			kv.MaxBlocks = defaultKVMaxBlocks
		}
		if kv.StaleSecs == 0 {
			kv.StaleSecs = defaultKVStaleSecs
		}
	}
	if lc := p.LMCache; lc != nil {
		if lc.RefreshSecs == 0 {
			lc.RefreshSecs = defaultLMCacheRefreshSecs
		}
		if lc.StaleSecs == 0 {
			lc.StaleSecs = defaultLMCacheStaleSecs
		}
	}
}
