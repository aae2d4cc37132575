package engine

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
	"github.com/rolter-ai/rolter/tracing"
)

// Config is the decoded rolter.toml. Field names are the TOML keys (configs/rolter.example.toml). The
// section defaults are DefaultConfig, which decoding starts from; the defaults of the keys inside arrays of
// tables are set by SetDefaults, before validation. A Config returned by ParseConfig is complete and valid.
type Config struct {
	Server        ServerConfig     `toml:"server" json:"server"`
	Providers     []ProviderConfig `toml:"providers" json:"providers"`
	Routes        []RouteConfig    `toml:"routes" json:"routes"`
	MetricsScrape ScrapeConfig     `toml:"metrics_scrape" json:"metrics_scrape"`
	Health        HealthConfig     `toml:"health" json:"health"`
	Cooldown      CooldownConfig   `toml:"cooldown" json:"cooldown"`
	Breaker       BreakerConfig    `toml:"breaker" json:"breaker"`
	Retry         RetryConfig      `toml:"retry" json:"retry"`
	Timeouts      TimeoutsConfig   `toml:"timeouts" json:"timeouts"`
	Queue         QueueConfig      `toml:"queue" json:"queue"`
	Egress        egress.Config    `toml:"egress" json:"egress"`
	Control       ControlConfig    `toml:"control" json:"control"`
	Cluster       ClusterConfig    `toml:"cluster" json:"cluster"`
	Docs          DocsConfig       `toml:"docs" json:"docs"`
	Trace         TraceConfig      `toml:"trace" json:"trace"`
	Log           accesslog.Config `toml:"log" json:"log"`
	Tracing       tracing.Config   `toml:"tracing" json:"tracing"`

	// File is the path the config was read from ("" for in-memory configs); used in error messages.
	File string `toml:"-" json:"-"`

	// Keys are the data-plane API keys of the orgs made through the control plane, as keyed hashes:
	// SHA-256(KeyPepper || secret). Set by the control plane, never by the file.
	Keys      []DataKey `toml:"-" json:"-"`
	KeyPepper [32]byte  `toml:"-" json:"-"`
}

// ServerConfig is the data-plane listener.
type ServerConfig struct {
	Listen         string `toml:"listen" json:"listen"`
	MaxBodyBytes   int    `toml:"max_body_bytes" json:"max_body_bytes"`
	MaxHeaderBytes int    `toml:"max_header_bytes" json:"max_header_bytes"`
	// MaxBodyMemoryBytes bounds the request bytes held by every request at once (bodies as they arrive and
	// the prompt keys read from them); a request that would go over it is answered 503.
	MaxBodyMemoryBytes int `toml:"max_body_memory_bytes" json:"max_body_memory_bytes"`
	// MaxConns caps open client connections (0: derived from the open-file limit); MaxConnsPerIP caps them
	// per client address (0: no per-address cap).
	MaxConns      int `toml:"max_conns" json:"max_conns"`
	MaxConnsPerIP int `toml:"max_conns_per_ip" json:"max_conns_per_ip"`
	// RoutingMemoryBytes is the budget of the prefix tries of every cache-aware target together; a route
	// that does not set max_trie_nodes / max_trie_bytes gets an equal share per target.
	RoutingMemoryBytes    int     `toml:"routing_memory_bytes" json:"routing_memory_bytes"`
	ReadTimeoutSecs       float64 `toml:"read_timeout_secs" json:"read_timeout_secs"`
	WriteTimeoutSecs      float64 `toml:"write_timeout_secs" json:"write_timeout_secs"`
	IdleTimeoutSecs       float64 `toml:"idle_timeout_secs" json:"idle_timeout_secs"`
	DrainSecs             float64 `toml:"drain_secs" json:"drain_secs"`
	ExposeDecisionHeaders bool    `toml:"expose_decision_headers" json:"expose_decision_headers"`
	// ExposeMetrics serves GET /metrics on the data-plane listener.
	ExposeMetrics bool `toml:"expose_metrics" json:"expose_metrics"`
	// CacheKeyFields are top-level request body fields whose values make the engines cache the same prompt
	// apart (a per-user salt an engine-side plugin derives from "user", say): like vLLM's cache_salt, which is
	// always read, they join the prompt key's identity prefix, so requests that differ in them share no
	// prefix affinity (docs/architecture.md, "Prompt key").
	CacheKeyFields []string `toml:"cache_key_fields" json:"cache_key_fields"`
	// SessionHeaders are request headers that name a session, read after x-session-id and the body's
	// prompt_cache_key: the first one present pins the conversation (agent harnesses send their own).
	SessionHeaders []string `toml:"session_headers" json:"session_headers"`
}

// scannedFields are the top-level body fields the request scanner reads itself, which cannot be
// cache_key_fields.
var scannedFields = []string{"model", "stream", "messages", "prompt", "input", "instructions", "system", "cache_salt",
	"prompt_cache_key"}

// maxSessionHeaders bounds [server] session_headers: each is looked up on every request without a session.
const maxSessionHeaders = 8

// DataKey is one data-plane API key: the keyed hash of its secret and the org it belongs to.
type DataKey struct {
	Org  string
	Hash [32]byte
}

// ControlConfig is [control]: the control plane's own listener, its store, and where the superadmin token
// comes from.
type ControlConfig struct {
	Enabled       bool   `toml:"enabled" json:"enabled"`
	Listen        string `toml:"listen" json:"listen"`
	Store         string `toml:"store" json:"store"`
	AdminTokenEnv string `toml:"admin_token_env" json:"admin_token_env"`
	// Hosts are the names, besides the listen address (and localhost, 127.0.0.1 and [::1] on loopback), the
	// control plane answers to in the Host header: a name it is reached by through a proxy or DNS. A request
	// for any other name is refused, so a DNS name an attacker points at the gateway (DNS rebinding) cannot
	// make a browser talk to it as that name's origin. "name" matches any port, "name:port" that port.
	Hosts []string `toml:"hosts" json:"hosts"`
	// MaxConns caps the control plane's connections; connections beyond it are closed at once. The cap is
	// taken out of the socket budget when the control plane is enabled, so the data plane keeps its share
	// whatever the control plane's listener is sent.
	MaxConns int `toml:"max_conns" json:"max_conns"`
	// The control plane's http.Server timeouts: a request's head and body (read), its handling and answer
	// (write), and a keep-alive connection between requests (idle).
	ReadTimeoutSecs  float64 `toml:"read_timeout_secs" json:"read_timeout_secs"`
	WriteTimeoutSecs float64 `toml:"write_timeout_secs" json:"write_timeout_secs"`
	IdleTimeoutSecs  float64 `toml:"idle_timeout_secs" json:"idle_timeout_secs"`
	// Quotas bound what each org holds, whoever writes it through the API.
	Quotas QuotaConfig `toml:"quotas" json:"quotas"`
	// ProviderEnv lists the environment variables an org's provider may name in api_key_env and
	// kv_events.curve_secret_key_env. Every other variable is the operator's alone: the file's providers
	// read any, an org's provider naming another one is refused.
	ProviderEnv []string `toml:"provider_env" json:"provider_env"`
	// SecretsKeyEnv names the environment variable holding the key (32 bytes, base64) the store's org
	// secrets are encrypted with (AES-256-GCM); "" turns the secrets endpoints off.
	SecretsKeyEnv string `toml:"secrets_key_env" json:"secrets_key_env"`
}

// ControlConns is how many connections of the socket budget the control plane takes: its max_conns when
// it is enabled, else none.
func (c *ControlConfig) ControlConns() int {
	if !c.Enabled {
		return 0
	}
	return c.MaxConns
}

// equal reports whether c and o are the same [control] section, but for the quotas: the control plane
// reads them at every write, so they change on reload.
func (c *ControlConfig) equal(o *ControlConfig) bool {
	return c.Enabled == o.Enabled && c.Listen == o.Listen && c.Store == o.Store && c.AdminTokenEnv == o.AdminTokenEnv &&
		slices.Equal(c.Hosts, o.Hosts) && c.MaxConns == o.MaxConns && c.ReadTimeoutSecs == o.ReadTimeoutSecs &&
		c.WriteTimeoutSecs == o.WriteTimeoutSecs && c.IdleTimeoutSecs == o.IdleTimeoutSecs &&
		slices.Equal(c.ProviderEnv, o.ProviderEnv) && c.SecretsKeyEnv == o.SecretsKeyEnv
}

// QuotaConfig is [control.quotas]: what one org may hold. The operator sets it in the file; nothing written
// through the API can raise it, and the superadmin's writes into an org count too. 0 allows none.
type QuotaConfig struct {
	// RoutingMemoryBytes bounds the routing memory the explicit trie ceilings (max_trie_nodes,
	// max_trie_bytes) of the org's routes take together, every target counted (trieCost). The routes of
	// all orgs and the file together never take more than server.routing_memory_bytes.
	RoutingMemoryBytes int `toml:"routing_memory_bytes" json:"routing_memory_bytes"`
	Routes             int `toml:"routes" json:"routes"`
	Providers          int `toml:"providers" json:"providers"`
	// TargetsPerRoute bounds the targets of one route, Targets those of all the org's routes together.
	TargetsPerRoute int `toml:"targets_per_route" json:"targets_per_route"`
	Targets         int `toml:"targets" json:"targets"`
	// Keys and Tokens bound the org's data-plane keys and admin tokens that are not revoked.
	Keys   int `toml:"keys" json:"keys"`
	Tokens int `toml:"tokens" json:"tokens"`
}

// DefaultQuotas are [control.quotas]'s defaults.
var DefaultQuotas = QuotaConfig{RoutingMemoryBytes: 64 << 20, Routes: 64, Providers: 64, TargetsPerRoute: 16, Targets: 256,
	Keys: 64, Tokens: 16}

// ClusterConfig is [cluster]: the NATS server through which the gateway replicas of one fleet share their
// routing evidence and in-flight counts (docs/architecture.md, "Many gateways"). No NATSURL: off.
type ClusterConfig struct {
	// NATSURL lists the NATS servers, comma-separated (nats://host:port or tls://host:port).
	NATSURL string `toml:"nats_url" json:"nats_url"`
	// Subject prefixes the subjects used: <subject>.evidence and <subject>.load. Replicas that share it
	// share evidence, so one NATS can serve several fleets.
	Subject string `toml:"subject" json:"subject"`
	// PublishIntervalMs is how often evidence batches and in-flight counts are published. Short, because
	// evidence must reach the other replicas before the conversation's next turn does.
	PublishIntervalMs int `toml:"publish_interval_ms" json:"publish_interval_ms"`
	// MaxEntries bounds the peers' evidence kept (one entry per engine and checkpoint, 16 bytes each, the
	// count rounded up to a power of two).
	MaxEntries int `toml:"max_entries" json:"max_entries"`
	// EvidenceTTLSecs: a peer's evidence older than this no longer counts.
	EvidenceTTLSecs float64 `toml:"evidence_ttl_secs" json:"evidence_ttl_secs"`
	// QueueSize bounds the requests' evidence waiting to be published (784 bytes each); a full queue drops
	// (and counts) it.
	QueueSize int `toml:"queue_size" json:"queue_size"`

	// KeyEnv names the environment variable holding the fleet's shared key (at least 32 bytes): every
	// message carries an HMAC-SHA256 of it with a timestamp, and a message without a valid one is refused.
	// Required unless every nats_url is on loopback: any client that can publish on the subject could
	// otherwise steer routing.
	KeyEnv string `toml:"key_env" json:"key_env"`
	// NATS's own authentication, from the environment or from files, never in this file: at most one of
	// user_env with password_env, token_env, nkey_seed_file and creds_file.
	UserEnv      string `toml:"user_env" json:"user_env"`
	PasswordEnv  string `toml:"password_env" json:"password_env"`
	TokenEnv     string `toml:"token_env" json:"token_env"`
	NKeySeedFile string `toml:"nkey_seed_file" json:"nkey_seed_file"`
	CredsFile    string `toml:"creds_file" json:"creds_file"`
	// TLS: the CA that signs the servers' certificates (else the system's roots), and a client certificate
	// and key for a server that verifies its clients. tls:// URLs, or any of these, turn TLS on.
	TLSCAFile   string `toml:"tls_ca_file" json:"tls_ca_file"`
	TLSCertFile string `toml:"tls_cert_file" json:"tls_cert_file"`
	TLSKeyFile  string `toml:"tls_key_file" json:"tls_key_file"`

	// What one peer replica can claim, however authenticated: the peers remembered, a peer's in-flight
	// count per provider (also at most the provider's max_conns), and the evidence records a peer may send
	// per second (a token bucket holding a second's worth). What goes over is refused and counted.
	MaxPeers           int `toml:"max_peers" json:"max_peers"`
	MaxPeerInflight    int `toml:"max_peer_inflight" json:"max_peer_inflight"`
	PeerEvidencePerSec int `toml:"peer_evidence_per_sec" json:"peer_evidence_per_sec"`
}

// MinClusterKeyBytes is the shortest [cluster] key accepted.
const MinClusterKeyBytes = 32

// DocsConfig is [docs]: where the product's documentation is served, for the dashboard's links ("" =
// no links).
type DocsConfig struct {
	BaseURL string `toml:"base_url" json:"base_url"`
}

// TraceConfig is [trace]: the routing trace, one JSON line per request with lengths, hashes and the routing
// decision, never prompt text (capture.go; `rolter replay` reads it).
type TraceConfig struct {
	// Path is the file written ("" = no trace), rotated when it reaches MaxBytes, Keep old files kept.
	Path     string `toml:"path" json:"path"`
	MaxBytes int64  `toml:"max_bytes" json:"max_bytes"`
	Keep     int    `toml:"keep" json:"keep"`
	// BlockBytes is the prompt-key block size of the chained hashes.
	BlockBytes int `toml:"block_bytes" json:"block_bytes"`
	// SaltEnv names the environment variable holding the hashes' salt; "" draws a random salt at start (the
	// hashes of two runs then do not match).
	SaltEnv string `toml:"salt_env" json:"salt_env"`
	// QueueSize bounds the lines waiting to be written; a full queue drops lines and counts them.
	QueueSize int `toml:"queue_size" json:"queue_size"`
}

// ProviderConfig is one upstream engine (a vLLM or SGLang server, or any OpenAI-compatible API).
type ProviderConfig struct {
	// Org owns a provider made through the control plane ("" for the file's); its name is then
	// "<org id>/<name>" here, so orgs never collide.
	Org       string            `toml:"-" json:"-"`
	Name      string            `toml:"name" json:"name"`
	Kind      string            `toml:"kind" json:"kind"`
	APIBase   string            `toml:"api_base" json:"api_base"`
	APIKeyEnv string            `toml:"api_key_env" json:"api_key_env"`
	Headers   map[string]string `toml:"headers" json:"headers,omitempty"`
	MaxConns  int               `toml:"max_conns" json:"max_conns"`
	KVEvents  *KVEventsConfig   `toml:"kv_events" json:"kv_events,omitempty"`
	LMCache   *LMCacheConfig    `toml:"lmcache" json:"lmcache,omitempty"`

	// Headers above are sent upstream as they are, and shown by the API as they are: they are not secret.
	// An org's provider sends its secrets instead with APIKeySecret (the org secret sent as "Bearer
	// <secret>") and HeaderSecrets (header name -> the org secret sent as its value).
	APIKeySecret  string            `toml:"api_key_secret" json:"api_key_secret,omitempty"`
	HeaderSecrets map[string]string `toml:"header_secrets" json:"header_secrets,omitempty"`

	// Secrets are the values of the org's secrets that APIKeySecret and HeaderSecrets name, by name, set by
	// the control plane from its store (control.Compose): never encoded, so no answer, print or log of a
	// config carries them, and the engine never reads the store.
	Secrets map[string]string `toml:"-" json:"-"`
}

// envOf returns the environment variable name as pc may read it: a provider of the file any variable, an
// org's only one of allowed ([control] provider_env). For any other name it is "" and the environment is
// not read, so nothing built from an org's provider depends on what such a variable holds.
func (pc *ProviderConfig) envOf(name string, allowed []string) string {
	if name == "" || (pc.Org != "" && !slices.Contains(allowed, name)) {
		return ""
	}
	return os.Getenv(name)
}

// apiKey returns the key pc sends upstream as "Bearer <key>" (from its secret or its variable), and
// whether it has one.
func (pc *ProviderConfig) apiKey(allowed []string) (string, bool) {
	switch {
	case pc.APIKeySecret != "":
		return pc.Secrets[pc.APIKeySecret], true
	case pc.APIKeyEnv != "":
		return pc.envOf(pc.APIKeyEnv, allowed), true
	}
	return "", false
}

// curveKey returns the CURVE secret key of pc's kv_events ("" when it has none or may not read it).
func (pc *ProviderConfig) curveKey(allowed []string) string {
	if pc.KVEvents == nil {
		return ""
	}
	return pc.envOf(pc.KVEvents.CurveSecretKeyEnv, allowed)
}

// KVEventsConfig is a provider's vLLM KV-event stream (docs/architecture.md, "KV-event path").
type KVEventsConfig struct {
	Endpoint       string  `toml:"endpoint" json:"endpoint"`
	Topic          string  `toml:"topic" json:"topic"`
	ReplayEndpoint string  `toml:"replay_endpoint" json:"replay_endpoint"`
	Mode           string  `toml:"mode" json:"mode"`
	MaxBlocks      int     `toml:"max_blocks" json:"max_blocks"`
	StaleSecs      float64 `toml:"stale_secs" json:"stale_secs"`
	// Bind mode only: the publishers allowed to connect (addresses and CIDR prefixes; empty: anyone who
	// can reach the port), and CURVE - the environment variable holding the gateway's secret key (Z85) and
	// the allowed publishers' public keys. With CURVE, unauthenticated publishers are refused.
	AllowedPublishers []string `toml:"allowed_publishers" json:"allowed_publishers"`
	CurveSecretKeyEnv string   `toml:"curve_secret_key_env" json:"curve_secret_key_env"`
	CurveClientKeys   []string `toml:"curve_client_keys" json:"curve_client_keys"`
}

// LMCacheConfig is a provider's LMCache-style status endpoint.
type LMCacheConfig struct {
	Endpoint    string  `toml:"endpoint" json:"endpoint"`
	RefreshSecs float64 `toml:"refresh_secs" json:"refresh_secs"`
	StaleSecs   float64 `toml:"stale_secs" json:"stale_secs"`
}

// RouteConfig maps one public model name to targets and a strategy.
type RouteConfig struct {
	// Org owns a route made through the control plane ("" for the file's routes, which are public). A
	// request to an org's route needs one of the org's data-plane keys.
	Org      string         `toml:"-" json:"-"`
	Model    string         `toml:"model" json:"model"`
	Strategy string         `toml:"strategy" json:"strategy"`
	Targets  []TargetConfig `toml:"targets" json:"targets"`
	Params   RouteParams    `toml:"params" json:"params"`
	// Shadow ranks every request with other strategies too, without moving traffic ([routes.shadow];
	// shadow.go).
	Shadow *ShadowConfig `toml:"shadow" json:"shadow,omitempty"`
}

// ShadowConfig is [routes.shadow]: strategies that rank the route's requests beside the live one, each
// against its own counterfactual state, for comparison only.
type ShadowConfig struct {
	Strategies []string `toml:"strategies" json:"strategies"`
}

// needsKVEvents reports whether the route's strategy, or one of its shadows, routes on KV events.
func (rc *RouteConfig) needsKVEvents() bool {
	if strategies[rc.Strategy].needsKVEvents {
		return true
	}
	if rc.Shadow != nil {
		for _, name := range rc.Shadow.Strategies {
			if strategies[name].needsKVEvents {
				return true
			}
		}
	}
	return false
}

// maxShadows bounds the shadow strategies of one route.
const maxShadows = 4

// TargetConfig is one (provider, upstream model) pair of a route.
type TargetConfig struct {
	Provider string   `toml:"provider" json:"provider"`
	Model    string   `toml:"model" json:"model"`
	Weight   *float64 `toml:"weight" json:"weight,omitempty"`
}

// RouteParams holds strategy parameters. A parameter that the route's strategy does not use is an error,
// so a typo or a misplaced parameter never goes unnoticed.
type RouteParams struct {
	Threshold      *float64 `toml:"threshold" json:"threshold,omitempty"`
	MaxTrieNodes   *int     `toml:"max_trie_nodes" json:"max_trie_nodes,omitempty"`
	MaxTrieBytes   *int     `toml:"max_trie_bytes" json:"max_trie_bytes,omitempty"`
	SessionTTLSecs *float64 `toml:"session_ttl_secs" json:"session_ttl_secs,omitempty"`
	MaxSessions    *int     `toml:"max_sessions" json:"max_sessions,omitempty"`
	Epsilon        *float64 `toml:"epsilon" json:"epsilon,omitempty"`
	VirtualNodes   *int     `toml:"virtual_nodes" json:"virtual_nodes,omitempty"`
	KeyBytes       *int     `toml:"key_bytes" json:"key_bytes,omitempty"`
	WeightFactor   *float64 `toml:"weight_factor" json:"weight_factor,omitempty"`
	LoadFactor     *float64 `toml:"load_factor" json:"load_factor,omitempty"`
	CacheFactor    *float64 `toml:"cache_factor" json:"cache_factor,omitempty"`
	// StaleGap and StaleWindow: a target's trie is emptied when its recent predicted reuse exceeds the
	// delivered by more than StaleGap over at least StaleWindow measured responses (0 turns it off).
	StaleGap    *float64 `toml:"stale_gap" json:"stale_gap,omitempty"`
	StaleWindow *int     `toml:"stale_window" json:"stale_window,omitempty"`
	// Home (cache_aware, precise_cache_aware): a request whose prefix no target holds goes to its conversation's rendezvous
	// home when that target is not overloaded (true), or to the least-loaded target (false).
	Home *bool `toml:"home" json:"home,omitempty"`
	// OverloadMargin and OverloadFactor (cache_aware): a target is overloaded when its load exceeds the
	// least-loaded eligible target's by more than the margin (2) and is more than factor (1.5) times it.
	OverloadMargin *float64 `toml:"overload_margin" json:"overload_margin,omitempty"`
	OverloadFactor *float64 `toml:"overload_factor" json:"overload_factor,omitempty"`
	// HotWindow (pipeline): how many recent requests the hot-prefix share is counted over; a prefix
	// matched by more than one engine's share of them has its cache term divided by the engines its
	// share fills. 0 turns it off.
	HotWindow *int `toml:"hot_window" json:"hot_window,omitempty"`
}

// ScrapeConfig is [metrics_scrape]: engine queue depth from each provider's /metrics.
type ScrapeConfig struct {
	Enabled      bool    `toml:"enabled" json:"enabled"`
	IntervalSecs float64 `toml:"interval_secs" json:"interval_secs"`
	TimeoutSecs  float64 `toml:"timeout_secs" json:"timeout_secs"`
	Path         string  `toml:"path" json:"path"`
}

// HealthConfig is [health]: active checks per provider.
type HealthConfig struct {
	Enabled            bool    `toml:"enabled" json:"enabled"`
	Path               string  `toml:"path" json:"path"`
	IntervalSecs       float64 `toml:"interval_secs" json:"interval_secs"`
	TimeoutSecs        float64 `toml:"timeout_secs" json:"timeout_secs"`
	UnhealthyThreshold int     `toml:"unhealthy_threshold" json:"unhealthy_threshold"`
	HealthyThreshold   int     `toml:"healthy_threshold" json:"healthy_threshold"`
	// FailOpen: when no target of a route is eligible, send the request to the least-bad one (true) rather
	// than answering 503 (false).
	FailOpen bool `toml:"fail_open" json:"fail_open"`
	// MaxEjectionPercent caps the share of providers that passive failure tracking (cooldown and breaker)
	// may take out of service at once; at least one may always be ejected. Active health checks are not
	// capped: a provider that fails its probes is down whatever the others do.
	MaxEjectionPercent float64 `toml:"max_ejection_percent" json:"max_ejection_percent"`
}

// CooldownConfig is [cooldown]: passive failure tracking.
type CooldownConfig struct {
	Enabled           bool    `toml:"enabled" json:"enabled"`
	Failures          int     `toml:"failures" json:"failures"`
	WindowSecs        float64 `toml:"window_secs" json:"window_secs"`
	BaseSecs          float64 `toml:"base_secs" json:"base_secs"`
	MaxSecs           float64 `toml:"max_secs" json:"max_secs"`
	MaxRetryAfterSecs float64 `toml:"max_retry_after_secs" json:"max_retry_after_secs"`
	// Consecutive5xx is how many HTTP 500-class answers in a row (with no success between them) count as
	// one failure. An engine that answers is alive; one request it cannot serve must not eject it.
	Consecutive5xx int `toml:"consecutive_5xx" json:"consecutive_5xx"`
}

// BreakerConfig is [breaker]: a per-provider circuit breaker.
type BreakerConfig struct {
	Enabled        bool    `toml:"enabled" json:"enabled"`
	Failures       int     `toml:"failures" json:"failures"`
	OpenSecs       float64 `toml:"open_secs" json:"open_secs"`
	HalfOpenProbes int     `toml:"half_open_probes" json:"half_open_probes"`
}

// RetryConfig is [retry].
type RetryConfig struct {
	MaxRetries   int     `toml:"max_retries" json:"max_retries"`
	BackoffMs    float64 `toml:"backoff_ms" json:"backoff_ms"`
	MaxBackoffMs float64 `toml:"max_backoff_ms" json:"max_backoff_ms"`
}

// TimeoutsConfig is [timeouts] for upstream calls. None of them cuts a healthy long stream: HeadersSecs
// bounds the wait for the response headers (for a non-streaming request that is the whole generation),
// IdleSecs bounds every gap between two reads of the response body after that.
type TimeoutsConfig struct {
	ConnectSecs float64 `toml:"connect_secs" json:"connect_secs"`
	HeadersSecs float64 `toml:"headers_secs" json:"headers_secs"`
	IdleSecs    float64 `toml:"idle_secs" json:"idle_secs"`
}

// QueueConfig is [queue]: admission control.
type QueueConfig struct {
	MaxInflight          int     `toml:"max_inflight" json:"max_inflight"`
	MaxInflightPerTarget int     `toml:"max_inflight_per_target" json:"max_inflight_per_target"`
	MaxWaitingPerTarget  int     `toml:"max_waiting_per_target" json:"max_waiting_per_target"`
	WaitTimeoutSecs      float64 `toml:"wait_timeout_secs" json:"wait_timeout_secs"`
	RetryAfterSecs       float64 `toml:"retry_after_secs" json:"retry_after_secs"`
}

// DefaultConfig returns a config with every section default (configs/rolter.example.toml lists them) and no
// providers or routes. TOML decoding starts from it, so a key a file leaves out keeps its default; the
// defaults of the keys inside arrays of tables ([[providers]], [[routes]]) are filled by SetDefaults.
func DefaultConfig() *Config {
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
			MaxConns: 64, ReadTimeoutSecs: 10, WriteTimeoutSecs: 60, IdleTimeoutSecs: 60, Quotas: DefaultQuotas},
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
// complete (decoding starts from DefaultConfig); an element of [[providers]] or [[routes]] starts from zero
// and gets its defaults here. Only zero values are filled, so setting the defaults of a config that has
// them changes nothing: Gateway.Reload sets them again on a config ParseConfig returned.
func (cfg *Config) SetDefaults() {
	cfg.Log.SetDefaults()
	cfg.Tracing.SetDefaults()
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
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
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		if r.Strategy == "" {
			r.Strategy = defaultStrategy
		}
		for j := range r.Targets {
			t := &r.Targets[j]
			if t.Model == "" {
				t.Model = r.Model
			}
			if t.Weight == nil {
				w := defaultTargetWeight
				t.Weight = &w
			}
		}
	}
}

// ConfigError is one problem found in a config file.
type ConfigError struct {
	File string
	Line int
	Key  string
	Msg  string
	// Quota says the problem is a budget the operator set being exceeded (server.routing_memory_bytes,
	// [control.quotas]): the control plane answers it as quota_exceeded.
	Quota bool
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:", e.Line)
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// ConfigErrors is every problem found in a config; it is returned whole so users fix them in one pass.
type ConfigErrors []*ConfigError

func (es ConfigErrors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// LoadConfig reads and validates the config at path. On any problem it returns ConfigErrors listing all of them.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read config %q: %w", path, err)
	}
	return ParseConfig(data, path)
}

// ParseConfig decodes data strictly (unknown keys are errors), applies defaults and validates everything.
// file names the source in error messages.
func ParseConfig(data []byte, file string) (*Config, error) {
	cfg := DefaultConfig()
	cfg.File = file
	lines := scanKeyLines(data)
	v := &validator{file: file, lines: lines}

	md, err := toml.Decode(string(data), cfg)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			v.errs = append(v.errs, &ConfigError{File: file, Line: pe.Position.Line, Msg: pe.Message})
			return nil, v.errs
		}
		// Type mismatches carry the key in the message; find its line.
		msg := err.Error()
		v.errs = append(v.errs, &ConfigError{File: file, Line: lines.firstLineMentioning(msg), Msg: msg})
		return nil, v.errs
	}
	seen := map[string]int{}
	for _, k := range md.Undecoded() {
		plain := k.String()
		line := lines.nthLine(plain, seen[plain])
		seen[plain]++
		v.errs = append(v.errs, &ConfigError{File: file, Line: line, Key: plain, Msg: "unknown key"})
	}
	cfg.SetDefaults()
	v.validate(cfg)
	if len(v.errs) > 0 {
		return nil, v.errs
	}
	return cfg, nil
}

// ValidateConfig checks a config built in code (the control plane's, composed from the file and its
// store) exactly as ParseConfig checks a file - one validation path - and sets its defaults. Each
// problem's Key is its path ("providers[3].kv_events.endpoint"); there is no line.
func ValidateConfig(cfg *Config) ConfigErrors { return validateConfig(cfg) }

// validateConfig does to cfg what ParseConfig does after decoding: it sets the defaults cfg lacks (changing
// cfg) and checks it. Problems are returned all at once; the lines of a config that did not come from a
// file are unknown.
func validateConfig(cfg *Config) ConfigErrors {
	v := &validator{file: cfg.File}
	cfg.SetDefaults()
	v.validate(cfg)
	return v.errs
}

// validator collects the problems of one config. Each section has its method, which reports every problem
// of that section under its key path; none of them changes the config.
type validator struct {
	file   string
	lines  keyLines
	errs   ConfigErrors
	policy *egress.Policy // [egress], once checked: every endpoint the gateway dials is checked against it
	// self are the gateway's own listeners ([server] listen, [control] listen when enabled): no endpoint the
	// gateway dials may be one of them. kvBindPorts is [egress] kv_bind_ports.
	self        []selfListener
	kvBindPorts []int
}

// addf records a problem with the value at key (an indexed path such as "routes[1].targets[0].provider").
func (v *validator) addf(key, format string, args ...any) {
	v.errs = append(v.errs, &ConfigError{File: v.file, Line: v.lines.lineOf(key), Key: key, Msg: fmt.Sprintf(format, args...)})
}

// validate checks cfg, whose defaults are set (SetDefaults).
func (v *validator) validate(cfg *Config) {
	v.server(&cfg.Server)
	v.policy = v.egress(&cfg.Egress)
	v.self = ownListeners(cfg)
	v.kvBindPorts = cfg.Egress.KVBindPorts
	providers := v.providers(cfg.Providers, cfg.Control.ProviderEnv)
	v.routes(cfg.Routes, cfg.Providers, providers)
	v.routingMemory(cfg)
	v.metricsScrape(&cfg.MetricsScrape)
	v.health(&cfg.Health)
	v.cooldown(&cfg.Cooldown)
	v.breaker(&cfg.Breaker)
	v.retry(&cfg.Retry)
	v.timeouts(&cfg.Timeouts)
	v.queue(&cfg.Queue)
	v.control(&cfg.Control)
	v.cluster(&cfg.Cluster)
	v.trace(&cfg.Trace)
	v.observers(&cfg.Log, &cfg.Tracing)
	if b := cfg.Docs.BaseURL; b != "" {
		if err := checkHTTPURL(b); err != nil {
			v.addf("docs.base_url", "%s", err)
		}
	}
}

// observers checks [log] and [tracing] with their packages' own checks, and the tracing endpoint's host
// against the egress policy.
func (v *validator) observers(l *accesslog.Config, t *tracing.Config) {
	add := func(err error) {
		var le *accesslog.ConfigError
		var te *tracing.ConfigError
		switch {
		case errors.As(err, &le):
			v.addf(le.Key, "%s", le.Msg)
		case errors.As(err, &te):
			v.addf(te.Key, "%s", te.Msg)
		default:
			v.addf("log", "%s", err)
		}
	}
	for _, err := range unjoin(l.Validate()) {
		add(err)
	}
	terrs := unjoin(t.Validate())
	for _, err := range terrs {
		add(err)
	}
	if len(terrs) == 0 && t.Endpoint != "" {
		v.egressURL("tracing.endpoint", t.Endpoint)
	}
}

// trace checks [trace].
func (v *validator) trace(t *TraceConfig) {
	if t.Path == "" {
		return
	}
	if t.MaxBytes < 4096 {
		v.addf("trace.max_bytes", "must be >= 4096, got %d", t.MaxBytes)
	}
	if t.Keep < 1 || t.Keep > 1000 {
		v.addf("trace.keep", "must be between 1 and 1000, got %d", t.Keep)
	}
	if t.BlockBytes < 16 || t.BlockBytes > 1<<20 {
		v.addf("trace.block_bytes", "must be between 16 and 1048576, got %d", t.BlockBytes)
	}
	if t.QueueSize < 1 || t.QueueSize > 1<<20 {
		v.addf("trace.queue_size", "must be between 1 and 1048576, got %d", t.QueueSize)
	}
	if t.SaltEnv != "" && os.Getenv(t.SaltEnv) == "" {
		v.addf("trace.salt_env", "environment variable %s is empty or not set", t.SaltEnv)
	}
}

// control checks [control].
func (v *validator) control(c *ControlConfig) {
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		v.addf("control.listen", "cannot parse listen address %q: want host:port", c.Listen)
	}
	if c.Store == "" {
		v.addf("control.store", "missing store path")
	}
	if c.AdminTokenEnv == "" {
		v.addf("control.admin_token_env", "missing environment variable name")
	}
	for _, h := range c.Hosts {
		if !validControlHost(h) {
			v.addf("control.hosts", "cannot use %q: want a host name or IP address, with an optional :port", h)
		}
	}
	if c.MaxConns < 1 || c.MaxConns > 65536 {
		v.addf("control.max_conns", "must be between 1 and 65536, got %d", c.MaxConns)
	}
	v.positive("control.read_timeout_secs", c.ReadTimeoutSecs)
	v.positive("control.write_timeout_secs", c.WriteTimeoutSecs)
	v.positive("control.idle_timeout_secs", c.IdleTimeoutSecs)
	q := &c.Quotas
	for _, f := range []struct {
		key string
		n   int
	}{{"routing_memory_bytes", q.RoutingMemoryBytes}, {"routes", q.Routes}, {"providers", q.Providers},
		{"targets_per_route", q.TargetsPerRoute}, {"targets", q.Targets}, {"keys", q.Keys}, {"tokens", q.Tokens}} {
		v.nonNegativeInt("control.quotas."+f.key, f.n)
	}
	if c.SecretsKeyEnv != "" && !validEnvName(c.SecretsKeyEnv) {
		v.addf("control.secrets_key_env", "invalid environment variable name %q", c.SecretsKeyEnv)
	}
	for i, name := range c.ProviderEnv {
		key := fmt.Sprintf("control.provider_env[%d]", i)
		switch {
		case !validEnvName(name):
			v.addf(key, "invalid environment variable name %q", name)
		case name == c.AdminTokenEnv || name == c.SecretsKeyEnv:
			// The control plane's own keys: an org's provider naming one would send it to any api_base.
			v.addf(key, "cannot give %q to orgs: it holds a key of the control plane", name)
		case slices.Index(c.ProviderEnv, name) < i:
			v.addf(key, "%q is listed twice", name)
		}
	}
}

// validEnvName reports whether s is a portable environment variable name: letters, digits and '_', not
// starting with a digit.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r == '_' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// routingMemory checks that the explicit trie ceilings of the routes, every target counted, fit
// server.routing_memory_bytes all together and [control.quotas] routing_memory_bytes per org: a route's
// own ceilings are taken as they are (trieShare gives the other routes what is left), so without this
// check one route could reserve any amount. The routes are summed in order - the file's first, then the
// orgs' - and the route that goes over is the one refused.
func (v *validator) routingMemory(cfg *Config) {
	budget, quota := cfg.Server.RoutingMemoryBytes, cfg.Control.Quotas.RoutingMemoryBytes
	total := 0
	byOrg := map[string]int{}
	for i := range cfg.Routes {
		rc := &cfg.Routes[i]
		cost := routeTrieCost(rc)
		if cost == 0 {
			continue
		}
		key := fmt.Sprintf("routes[%d].params.max_trie_bytes", i)
		if rc.Params.MaxTrieBytes == nil {
			key = fmt.Sprintf("routes[%d].params.max_trie_nodes", i)
		}
		total += cost
		if total > budget {
			v.quotaf(key, "the trie ceilings of route %q take %d bytes of routing memory (%d targets); with the other routes' that is %d bytes, over server.routing_memory_bytes (%d)",
				rc.Model, cost, len(rc.Targets), total, budget)
			total -= cost
			continue
		}
		if rc.Org == "" {
			continue
		}
		if byOrg[rc.Org]+cost > quota {
			v.quotaf(key, "the trie ceilings of route %q take %d bytes of routing memory (%d targets); with the org's other routes that is %d bytes, over the org's quota ([control.quotas] routing_memory_bytes, %d)",
				rc.Model, cost, len(rc.Targets), byOrg[rc.Org]+cost, quota)
			total -= cost
			continue
		}
		byOrg[rc.Org] += cost
	}
}

// quotaf records a problem that is a budget being exceeded (ConfigError.Quota).
func (v *validator) quotaf(key, format string, args ...any) {
	v.addf(key, format, args...)
	v.errs[len(v.errs)-1].Quota = true
}

// validControlHost reports whether h is a Host header value [control] hosts can list: a DNS name or an IP
// address (IPv6 in brackets when a port follows), with an optional port.
func validControlHost(h string) bool {
	host := h
	if hp, port, err := net.SplitHostPort(h); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return false
		}
		host = hp
	}
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")); err == nil {
		return true
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// cluster checks [cluster]; the NATS servers' hosts go through the egress policy like every address the
// gateway dials.
func (v *validator) cluster(c *ClusterConfig) {
	if c.NATSURL == "" {
		return
	}
	for _, raw := range strings.Split(c.NATSURL, ",") {
		raw = strings.TrimSpace(raw)
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Hostname() == "" || u.Port() == "" ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			v.addf("cluster.nats_url", "cannot use %q: want nats://host:port or tls://host:port, comma-separated", raw)
			continue
		}
		if u.User != nil {
			v.addf("cluster.nats_url", "cannot use %q: credentials do not belong in the config file", u.Redacted())
			continue
		}
		v.egressURL("cluster.nats_url", raw)
	}
	if !validSubject(c.Subject) {
		v.addf("cluster.subject", "cannot use %q: want dot-separated tokens of letters, digits, '-' and '_'", c.Subject)
	}
	if c.PublishIntervalMs < 10 || c.PublishIntervalMs > 10000 {
		v.addf("cluster.publish_interval_ms", "must be between 10 and 10000, got %d", c.PublishIntervalMs)
	}
	if c.MaxEntries < 1024 || c.MaxEntries > 1<<26 {
		v.addf("cluster.max_entries", "must be between 1024 and 67108864, got %d", c.MaxEntries)
	}
	if !(c.EvidenceTTLSecs > 0 && c.EvidenceTTLSecs <= 86400) {
		v.addf("cluster.evidence_ttl_secs", "must be in (0, 86400], got %v", c.EvidenceTTLSecs)
	}
	if c.QueueSize < 1 || c.QueueSize > 1<<16 {
		v.addf("cluster.queue_size", "must be between 1 and 65536, got %d", c.QueueSize)
	}
	if c.MaxPeers < 1 || c.MaxPeers > 1024 {
		v.addf("cluster.max_peers", "must be between 1 and 1024, got %d", c.MaxPeers)
	}
	if c.MaxPeerInflight < 1 || c.MaxPeerInflight > 1<<24 {
		v.addf("cluster.max_peer_inflight", "must be between 1 and 16777216, got %d", c.MaxPeerInflight)
	}
	if c.PeerEvidencePerSec < 1 || c.PeerEvidencePerSec > 1<<20 {
		v.addf("cluster.peer_evidence_per_sec", "must be between 1 and 1048576, got %d", c.PeerEvidencePerSec)
	}
	v.clusterKey(c)
	v.clusterAuth(c)
}

// clusterKey checks the shared key's variable, and that there is one unless NATS is on loopback only.
func (v *validator) clusterKey(c *ClusterConfig) {
	if c.KeyEnv == "" {
		if !loopbackURLs(c.NATSURL) {
			v.addf("cluster.key_env", "missing: a nats_url off loopback needs a shared key to authenticate the replicas' messages")
		}
		return
	}
	if k := os.Getenv(c.KeyEnv); len(k) < MinClusterKeyBytes {
		v.addf("cluster.key_env", "environment variable %s must hold a key of at least %d bytes", c.KeyEnv, MinClusterKeyBytes)
	}
}

// clusterAuth checks the NATS credentials: their variables are set, their files readable, and one kind at
// most is given.
func (v *validator) clusterAuth(c *ClusterConfig) {
	kinds := 0
	if c.UserEnv != "" || c.PasswordEnv != "" {
		kinds++
		if c.UserEnv == "" || c.PasswordEnv == "" {
			v.addf("cluster.user_env", "user_env and password_env go together")
		}
		v.envSet("cluster.user_env", c.UserEnv)
		v.envSet("cluster.password_env", c.PasswordEnv)
	}
	if c.TokenEnv != "" {
		kinds++
		v.envSet("cluster.token_env", c.TokenEnv)
	}
	for _, f := range []struct{ key, path string }{
		{"cluster.nkey_seed_file", c.NKeySeedFile}, {"cluster.creds_file", c.CredsFile},
	} {
		if f.path != "" {
			kinds++
			v.readable(f.key, f.path)
		}
	}
	if kinds > 1 {
		v.addf("cluster", "cannot use more than one of user_env/password_env, token_env, nkey_seed_file and creds_file")
	}
	if c.TLSCAFile != "" {
		if pem, ok := v.readable("cluster.tls_ca_file", c.TLSCAFile); ok && !x509.NewCertPool().AppendCertsFromPEM(pem) {
			v.addf("cluster.tls_ca_file", "cannot use %q: no PEM certificate in it", c.TLSCAFile)
		}
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		v.addf("cluster.tls_cert_file", "tls_cert_file and tls_key_file go together")
		return
	}
	if c.TLSCertFile != "" {
		_, okCert := v.readable("cluster.tls_cert_file", c.TLSCertFile)
		_, okKey := v.readable("cluster.tls_key_file", c.TLSKeyFile)
		if okCert && okKey {
			if _, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile); err != nil {
				v.addf("cluster.tls_cert_file", "cannot load the client certificate %q: %s", c.TLSCertFile, err)
			}
		}
	}
}

// envSet checks that the environment variable name, when given, is set and not empty.
func (v *validator) envSet(key, name string) {
	if name != "" && os.Getenv(name) == "" {
		v.addf(key, "environment variable %s is empty or not set", name)
	}
}

// readable reads a file the config names, reporting it when it cannot.
func (v *validator) readable(key, path string) ([]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		v.addf(key, "cannot read %q: %s", path, err)
		return nil, false
	}
	return b, true
}

// loopbackURLs reports whether every URL of a comma-separated list has a loopback host.
func loopbackURLs(urls string) bool {
	for _, raw := range strings.Split(urls, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			return false
		}
		h := u.Hostname()
		if ip := net.ParseIP(h); !(h == "localhost" || ip != nil && ip.IsLoopback()) {
			return false
		}
	}
	return true
}

// validSubject reports whether s is a NATS subject prefix without wildcards.
func validSubject(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
		for _, r := range tok {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// egress checks [egress] and returns its policy (nil when the section is bad: the endpoints are then not
// checked against it, the section's own errors say why).
func (v *validator) egress(c *egress.Config) *egress.Policy {
	p, err := egress.New(*c)
	for _, e := range unjoin(err) {
		key := "egress"
		for _, k := range []string{"allow_hosts", "deny_hosts", "allow_cidrs", "deny_cidrs", "kv_bind_ports"} {
			if strings.HasPrefix(e.Error(), "cannot use "+k+" ") {
				key += "." + k
			}
		}
		v.addf(key, "%s", e)
	}
	return p
}

// egressURL checks the host of an http(s) URL the gateway will dial against the egress policy: an IP
// literal completely, a name by its name rules (its addresses are checked when it is dialled).
func (v *validator) egressURL(key, raw string) {
	u, err := url.Parse(raw)
	if err != nil || v.policy == nil {
		return
	}
	if err := v.policy.CheckHost(u.Hostname()); err != nil {
		v.addf(key, "%s", err)
	}
}

// egressZMQ checks the host of a tcp:// ZMQ endpoint the subscriber connects to, and that it is none of
// the gateway's own listeners.
func (v *validator) egressZMQ(key, endpoint string) {
	rest, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		return
	}
	host, port := egress.SplitHostPort(rest)
	v.notSelf(key, endpoint, host, port)
	if v.policy == nil {
		return
	}
	if err := v.policy.CheckHost(host); err != nil {
		v.addf(key, "%s", err)
	}
}

// orgKVEndpoints checks the endpoints of an org's kv_events, which passed the subscriber's own rules.
func (v *validator) orgKVEndpoints(key string, kv *KVEventsConfig) {
	for _, e := range []struct{ key, endpoint string }{{".endpoint", kv.Endpoint}, {".replay_endpoint", kv.ReplayEndpoint}} {
		if strings.HasPrefix(e.endpoint, "ipc://") || strings.HasPrefix(e.endpoint, "inproc://") {
			v.addf(key+e.key, "cannot use %q: an org's provider takes tcp:// endpoints only (ipc:// and inproc:// reach inside the gateway's host)", e.endpoint)
		}
	}
	if kv.Mode != "bind" {
		return
	}
	rest, ok := strings.CutPrefix(kv.Endpoint, "tcp://")
	if !ok {
		return
	}
	_, port := egress.SplitHostPort(rest)
	if n, err := strconv.Atoi(port); err != nil || !slices.Contains(v.kvBindPorts, n) {
		v.addf(key+".endpoint", "cannot bind %q: an org's provider binds only on a port [egress] kv_bind_ports lists", kv.Endpoint)
	}
}

// selfListener is one of the gateway's own listening addresses, host (possibly empty: every address) and
// port, as the config names it.
type selfListener struct {
	key, addr, host, port string
}

// ownListeners returns the listeners of cfg: the data plane's, and the control plane's when it is on. A
// listener on port 0 (a port picked at start) cannot be known here.
func ownListeners(cfg *Config) []selfListener {
	var out []selfListener
	add := func(key, addr string) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return
		}
		if n, err := net.LookupPort("tcp", port); err == nil && n != 0 {
			out = append(out, selfListener{key: key, addr: addr, host: host, port: strconv.Itoa(n)})
		}
	}
	add("server.listen", cfg.Server.Listen)
	if cfg.Control.Enabled {
		add("control.listen", cfg.Control.Listen)
	}
	return out
}

// notSelfURL checks that the http(s) URL raw is none of the gateway's own listeners.
func (v *validator) notSelfURL(key, raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	v.notSelf(key, raw, u.Hostname(), port)
}

// notSelf refuses an endpoint (named by raw in the message) at host and port that is one of the gateway's
// listeners: a provider pointing at the gateway makes every request it routes there come back to it.
// Names other than localhost are not resolved (the check runs without DNS); the hop header stops the loops
// of those at the first request (loop.go).
func (v *validator) notSelf(key, raw, host, port string) {
	n, err := net.LookupPort("tcp", port)
	if err != nil {
		return
	}
	for _, l := range v.self {
		if l.port == strconv.Itoa(n) && l.reaches(host) {
			v.addf(key, "cannot use %q: it is the gateway's own listener (%s %q), which would route the requests back to itself", raw, l.key, l.addr)
			return
		}
	}
}

// reaches reports whether connecting to host (on the listener's port) reaches the listener: the host it
// names, a loopback or unspecified address (or localhost) for a listener on every address or on loopback,
// and any address of this host's interfaces for a listener on every address.
func (l selfListener) reaches(host string) bool {
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "*" {
		host = "0.0.0.0" // ZMQ's every-address bind
	}
	la, lerr := netip.ParseAddr(l.host)
	everywhere := l.host == "" || l.host == "*" || (lerr == nil && la.IsUnspecified())
	onLoopback := isLocalhostName(l.host) || (lerr == nil && la.IsLoopback())
	if l.host != "" && strings.EqualFold(host, l.host) {
		return true
	}
	if isLocalhostName(host) {
		return everywhere || onLoopback
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap().WithZone("")
	switch {
	case a.IsLoopback() || a.IsUnspecified():
		return everywhere || onLoopback
	case lerr == nil && a == la.Unmap().WithZone(""):
		return true
	}
	return everywhere && slices.Contains(localAddrs(), a)
}

// isLocalhostName reports whether name is localhost or a name under it, loopback by definition (RFC 6761).
func isLocalhostName(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

// localAddrs are the addresses of this host's interfaces, read once.
var localAddrs = sync.OnceValue(func() []netip.Addr {
	var out []netip.Addr
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range as {
		if pn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(pn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
})

// server checks [server].
func (v *validator) server(s *ServerConfig) {
	if _, _, err := net.SplitHostPort(s.Listen); err != nil {
		v.addf("server.listen", "cannot parse listen address %q: want host:port", s.Listen)
	}
	v.positiveInt("server.max_body_bytes", s.MaxBodyBytes)
	v.positiveInt("server.max_header_bytes", s.MaxHeaderBytes)
	v.positiveInt("server.max_body_memory_bytes", s.MaxBodyMemoryBytes)
	if s.MaxBodyMemoryBytes > 0 && s.MaxBodyMemoryBytes < s.MaxBodyBytes {
		v.addf("server.max_body_memory_bytes", "must be >= server.max_body_bytes (%d), got %d", s.MaxBodyBytes, s.MaxBodyMemoryBytes)
	}
	v.nonNegativeInt("server.max_conns", s.MaxConns)
	v.nonNegativeInt("server.max_conns_per_ip", s.MaxConnsPerIP)
	if s.RoutingMemoryBytes < 1<<20 {
		v.addf("server.routing_memory_bytes", "must be >= 1048576 (1 MiB), got %d", s.RoutingMemoryBytes)
	}
	v.nonNegative("server.read_timeout_secs", s.ReadTimeoutSecs)
	v.nonNegative("server.write_timeout_secs", s.WriteTimeoutSecs)
	v.nonNegative("server.idle_timeout_secs", s.IdleTimeoutSecs)
	v.nonNegative("server.drain_secs", s.DrainSecs)
	if len(s.CacheKeyFields) > maxKeyFields {
		v.addf("server.cache_key_fields", "at most %d fields, got %d", maxKeyFields, len(s.CacheKeyFields))
	}
	for i, f := range s.CacheKeyFields {
		key := fmt.Sprintf("server.cache_key_fields[%d]", i)
		switch {
		case f == "" || len(f) > maxKeyFieldLen:
			v.addf(key, "a field name must have 1 to %d bytes, got %q", maxKeyFieldLen, f)
		case slices.Contains(scannedFields, f):
			v.addf(key, "%q is read by the gateway itself; cannot use it as a cache key field", f)
		case slices.Index(s.CacheKeyFields, f) < i:
			v.addf(key, "%q is listed twice", f)
		}
	}
	if len(s.SessionHeaders) > maxSessionHeaders {
		v.addf("server.session_headers", "at most %d headers, got %d", maxSessionHeaders, len(s.SessionHeaders))
	}
	for i, h := range s.SessionHeaders {
		key := fmt.Sprintf("server.session_headers[%d]", i)
		switch {
		case !validHeaderName(h):
			v.addf(key, "invalid header name %q", h)
		case strings.EqualFold(h, "x-session-id"):
			v.addf(key, "x-session-id is always read first; list only other headers")
		case slices.IndexFunc(s.SessionHeaders[:i], func(o string) bool { return strings.EqualFold(o, h) }) >= 0:
			v.addf(key, "%q is listed twice", h)
		}
	}
}

// providers checks [[providers]] and returns the index of each provider name (its first, if repeated).
func (v *validator) providers(ps []ProviderConfig, allowed []string) map[string]int {
	byName := make(map[string]int, len(ps))
	for i := range ps {
		p := &ps[i]
		key := fmt.Sprintf("providers[%d]", i)
		if p.Name == "" {
			v.addf(key+".name", "missing provider name")
		} else if j, dup := byName[p.Name]; dup {
			v.addf(key+".name", "duplicate provider name %q (also providers[%d])", p.Name, j)
		} else {
			byName[p.Name] = i
		}
		if p.Kind != kindOpenAICompatible {
			v.addf(key+".kind", "unknown provider kind %q; supported: %q", p.Kind, kindOpenAICompatible)
		}
		if err := checkHTTPURL(p.APIBase); err != nil {
			v.addf(key+".api_base", "%s", err)
		} else {
			v.egressURL(key+".api_base", p.APIBase)
			v.notSelfURL(key+".api_base", p.APIBase)
		}
		v.providerAuth(key, p, allowed)
		for _, name := range slices.Sorted(maps.Keys(p.Headers)) {
			if !validHeaderName(name) {
				v.addf(key+".headers", "invalid header name %q", name)
			} else if strings.HasPrefix(strings.ToLower(name), "x-rolter-") {
				v.addf(key+".headers", "cannot set header %q: x-rolter-* headers are the gateway's own", name)
			} else if why := fieldValueFault(p.Headers[name]); why != "" {
				// The value is not quoted: it may be a credential.
				v.addf(key+".headers", "invalid value of header %q: %s", name, why)
			}
		}
		v.positiveInt(key+".max_conns", p.MaxConns)
		if p.KVEvents != nil {
			v.kvEvents(key+".kv_events", p, allowed)
		}
		if p.LMCache != nil {
			v.lmcache(key+".lmcache", p.LMCache)
		}
	}
	v.kvSharedBinds(ps, allowed)
	return byName
}

// providerAuth checks where provider p's credentials come from: an environment variable (any for the
// file's providers, one of allowed for an org's), or, for an org's provider, the org's secrets.
func (v *validator) providerAuth(key string, p *ProviderConfig, allowed []string) {
	if p.APIKeyEnv != "" {
		v.providerEnv(key+".api_key_env", p, p.APIKeyEnv, allowed)
		if p.APIKeySecret != "" {
			v.addf(key+".api_key_secret", "cannot use both api_key_env and api_key_secret")
		}
	}
	if p.Org == "" {
		const fileSecrets = "secrets are an org's, set through the control plane; a provider of the file reads api_key_env"
		if p.APIKeySecret != "" {
			v.addf(key+".api_key_secret", fileSecrets)
		}
		if len(p.HeaderSecrets) > 0 {
			v.addf(key+".header_secrets", fileSecrets)
		}
		return
	}
	if p.APIKeySecret != "" {
		v.secret(key+".api_key_secret", p, p.APIKeySecret)
	}
	_, hasKey := p.apiKey(allowed)
	for _, h := range slices.Sorted(maps.Keys(p.HeaderSecrets)) {
		hk := key + ".header_secrets"
		switch {
		case !validHeaderName(h):
			v.addf(hk, "invalid header name %q", h)
		case slices.ContainsFunc(slices.Collect(maps.Keys(p.Headers)), func(o string) bool { return strings.EqualFold(o, h) }):
			v.addf(hk, "header %q is set by headers too", h)
		case hasKey && strings.EqualFold(h, "authorization"):
			v.addf(hk, "header %q is the API key's: use api_key_secret alone", h)
		default:
			v.secret(hk, p, p.HeaderSecrets[h])
		}
	}
}

// providerEnv checks the environment variable name that provider p reads. An org's provider naming a
// variable the operator did not list is refused with one message, the same whether the variable is set or
// not, and without reading it: an org learns nothing of the gateway's environment.
func (v *validator) providerEnv(key string, p *ProviderConfig, name string, allowed []string) {
	if p.Org != "" && !slices.Contains(allowed, name) {
		v.addf(key, "cannot use environment variable %q: an org's provider reads only the variables of [control] provider_env", name)
		return
	}
	if p.envOf(name, allowed) == "" {
		v.addf(key, "environment variable %q is not set or empty", name)
	}
}

// secret checks that the org of provider p has the secret name, with a value a header can carry. The
// value never goes into a message.
func (v *validator) secret(key string, p *ProviderConfig, name string) {
	val, ok := p.Secrets[name]
	switch {
	case !ok:
		v.addf(key, "no secret %q: set it first with PUT /api/v1/orgs/{org}/secrets/%s", name, name)
	case !HeaderSafe(val):
		v.addf(key, "cannot send secret %q in a header: it is empty, holds a control character or starts or ends with whitespace", name)
	}
}

// HeaderSafe reports whether s can be sent as a header value: not empty, and an RFC 9110 field value
// (fieldValueFault), so a value never ends a header or the request.
func HeaderSafe(s string) bool { return s != "" && fieldValueFault(s) == "" }

// kvEvents checks [providers.kv_events] by the subscriber's own rules (kvindex.SubscriberConfig.Validate),
// so a config that passes `rolter check` is one the subscriber takes. An org's provider is held to more: no
// ipc:// or inproc:// endpoint (they reach inside the gateway's host and process), and a bind only on a
// port the operator lists in [egress] kv_bind_ports.
func (v *validator) kvEvents(key string, p *ProviderConfig, allowed []string) {
	kv := p.KVEvents
	if kv.CurveSecretKeyEnv != "" {
		v.providerEnv(key+".curve_secret_key_env", p, kv.CurveSecretKeyEnv, allowed)
	}
	sc := kv.subscriberConfig(p.curveKey(allowed))
	// stale_secs is TOML seconds: a value with no time.Duration would convert to whatever the platform
	// makes of it, so it is refused here and kvindex sees a valid duration.
	if !validSecs(kv.StaleSecs) {
		v.addf(key+".stale_secs", "must be a finite number of seconds within ±%.0f, got %v", maxSecs, kv.StaleSecs)
		sc.StaleAfter = 0
	}
	errs := unjoin(sc.Validate())
	for _, err := range errs {
		v.addf(key+kvKey(err), "%s", err)
	}
	if len(errs) == 0 {
		// The subscriber connects to these (a bind-mode endpoint is the gateway's own address).
		if kv.Mode != "bind" {
			v.egressZMQ(key+".endpoint", kv.Endpoint)
		}
		if kv.ReplayEndpoint != "" {
			v.egressZMQ(key+".replay_endpoint", kv.ReplayEndpoint)
		}
		if p.Org != "" {
			v.orgKVEndpoints(key, kv)
		}
	}
	if !kvindex.Supported {
		v.addf(key, "kv_events needs a build with cgo and libzmq; this binary was built with CGO_ENABLED=0")
	}
}

// kvSharedBinds checks the bind-mode kv_events of all providers together (kvindex.BindConflicts): providers
// that bind one endpoint share one socket and are told apart by topic, so each needs a distinct non-empty
// topic and all the same publisher policy. Before, four providers binding one address passed and three
// retried "address already in use" forever (issue 17).
func (v *validator) kvSharedBinds(ps []ProviderConfig, allowed []string) {
	cfgs := make([]*kvindex.SubscriberConfig, len(ps))
	for i := range ps {
		if kv := ps[i].KVEvents; kv != nil {
			sc := kv.subscriberConfig(ps[i].curveKey(allowed))
			cfgs[i] = &sc
		}
	}
	for _, c := range kvindex.BindConflicts(cfgs) {
		key := c.Key
		if key == "curve_secret_key" {
			key = "curve_secret_key_env" // the key is read from the environment variable it names
		}
		v.addf(fmt.Sprintf("providers[%d].kv_events.%s", c.I, key), "%s (also providers[%d], %q)", c.Msg, c.J, ps[c.J].Name)
	}
}

// subscriberConfig is c as the KV-event subscriber takes it, with the CURVE secret key curveKey read from
// the variable c names (ProviderConfig.curveKey); kvState.source subscribes with the same.
func (c *KVEventsConfig) subscriberConfig(curveKey string) kvindex.SubscriberConfig {
	sc := kvindex.SubscriberConfig{
		Endpoint:          c.Endpoint,
		Topic:             c.Topic,
		ReplayEndpoint:    c.ReplayEndpoint,
		Mode:              c.Mode,
		StaleAfter:        secs(c.StaleSecs),
		MaxBlocks:         c.MaxBlocks,
		AllowedPublishers: c.AllowedPublishers,
		CurveClientKeys:   c.CurveClientKeys,
		CurveSecretKey:    curveKey,
	}
	return sc
}

// lmcache checks [providers.lmcache]. The endpoint is checked by the poller's own rule
// (telemetry.LMCacheConfig.Validate), given the endpoint alone so that every error it reports is the
// endpoint's. refresh_secs and stale_secs are TOML seconds, checked here: the poller takes 0 to mean its
// default, but here a 0 was already replaced by ours.
func (v *validator) lmcache(key string, lc *LMCacheConfig) {
	if lc.Endpoint == "" {
		v.addf(key+".endpoint", "missing URL")
	} else {
		tc := telemetry.LMCacheConfig{URL: lc.Endpoint}
		errs := unjoin(tc.Validate())
		for _, err := range errs {
			v.addf(key+".endpoint", "%s", err)
		}
		if len(errs) == 0 {
			v.egressURL(key+".endpoint", lc.Endpoint)
			v.notSelfURL(key+".endpoint", lc.Endpoint)
		}
	}
	v.positive(key+".refresh_secs", lc.RefreshSecs)
	v.positive(key+".stale_secs", lc.StaleSecs)
}

// routes checks [[routes]] against the providers (byName: the index of each provider name).
func (v *validator) routes(rs []RouteConfig, ps []ProviderConfig, byName map[string]int) {
	models := make(map[string]int, len(rs))
	for i := range rs {
		r := &rs[i]
		key := fmt.Sprintf("routes[%d]", i)
		if r.Model == "" {
			v.addf(key+".model", "missing public model name")
		} else if j, dup := models[r.Model]; dup {
			v.addf(key+".model", "duplicate route for model %q (also routes[%d])", r.Model, j)
		} else {
			models[r.Model] = i
		}
		spec, known := strategies[r.Strategy]
		if !known {
			v.addf(key+".strategy", "unknown strategy %q; want one of %s", r.Strategy, strategyNames())
		}
		if len(r.Targets) == 0 {
			v.addf(key+".targets", "route %q has no targets", r.Model)
		}
		if len(r.Targets) > maxTargets {
			v.addf(key+".targets", "route %q has %d targets; at most %d are supported", r.Model, len(r.Targets), maxTargets)
		}
		for j := range r.Targets {
			t := &r.Targets[j]
			tk := fmt.Sprintf("%s.targets[%d]", key, j)
			if t.Provider == "" {
				v.addf(tk+".provider", "missing provider")
			} else if pi, ok := byName[t.Provider]; !ok {
				v.addf(tk+".provider", "unknown provider %q", t.Provider)
			} else if po := ps[pi].Org; po != "" && po != r.Org {
				// An org's provider serves only that org's routes (the file's providers serve anyone).
				v.addf(tk+".provider", "unknown provider %q", t.Provider)
			} else if k := slices.IndexFunc(r.Targets[:j], func(o TargetConfig) bool { return o.Provider == t.Provider }); k >= 0 {
				// A target is named by its provider (x-rolter-target, metric labels, the state view): a route
				// reaches one engine under two upstream models (a base model and its LoRA adapter) through
				// two providers with the same api_base.
				v.addf(tk+".provider", "provider %q is already routes[%d].targets[%d]; to route two models of one engine, declare a second provider with the same api_base", t.Provider, i, k)
			}
			if w := *t.Weight; !(w > 0) || math.IsInf(w, 0) {
				v.addf(tk+".weight", "weight must be > 0, got %v", w)
			}
		}
		if !known {
			continue
		}
		v.params(key+".params", r.Strategy, spec, &r.Params)
		v.needsKVEvents(key, r.Strategy, spec, r, ps, byName)
		if r.Shadow != nil {
			v.shadow(key, r, ps, byName)
		}
	}
}

// needsKVEvents checks that a strategy that routes on KV events has a source on every target.
func (v *validator) needsKVEvents(key, strategy string, spec strategySpec, r *RouteConfig, ps []ProviderConfig, byName map[string]int) {
	if !spec.needsKVEvents {
		return
	}
	for j := range r.Targets {
		if pi, ok := byName[r.Targets[j].Provider]; ok && ps[pi].KVEvents == nil {
			v.addf(fmt.Sprintf("%s.targets[%d].provider", key, j),
				"strategy %q needs [providers.kv_events] on provider %q", strategy, r.Targets[j].Provider)
		}
	}
}

// shadow checks [routes.shadow] of the route at routeKey: known strategies, each once, not the live one, at
// most maxShadows, and KV events on every target for a shadow that routes on them.
func (v *validator) shadow(routeKey string, r *RouteConfig, ps []ProviderConfig, byName map[string]int) {
	key := routeKey + ".shadow"
	names := r.Shadow.Strategies
	if len(names) > maxShadows {
		v.addf(key+".strategies", "at most %d shadow strategies per route, got %d", maxShadows, len(names))
	}
	for i, name := range names {
		sk := fmt.Sprintf("%s.strategies[%d]", key, i)
		spec, ok := strategies[name]
		switch {
		case !ok:
			v.addf(sk, "unknown strategy %q; want one of %s", name, strategyNames())
		case name == r.Strategy:
			v.addf(sk, "%q is the route's own strategy", name)
		case slices.Index(names, name) < i:
			v.addf(sk, "%q is listed twice", name)
		default:
			v.needsKVEvents(routeKey, name, spec, r, ps, byName)
		}
	}
}

func (v *validator) params(key, strategy string, spec strategySpec, p *RouteParams) {
	check := func(name string, set bool) bool {
		if !set {
			return false
		}
		if !slices.Contains(spec.params, name) {
			if len(spec.params) == 0 {
				v.addf(key+"."+name, "strategy %q takes no parameters", strategy)
			} else {
				v.addf(key+"."+name, "strategy %q does not use %q; its parameters: %s", strategy, name, strings.Join(spec.params, ", "))
			}
			return false
		}
		return true
	}
	if check("threshold", p.Threshold != nil) && !(*p.Threshold >= 0 && *p.Threshold <= 1) {
		v.addf(key+".threshold", "must be between 0 and 1, got %v", *p.Threshold)
	}
	if check("max_trie_nodes", p.MaxTrieNodes != nil) && *p.MaxTrieNodes < 16 {
		v.addf(key+".max_trie_nodes", "must be >= 16, got %d", *p.MaxTrieNodes)
	}
	if check("max_trie_bytes", p.MaxTrieBytes != nil) && *p.MaxTrieBytes < 1024 {
		v.addf(key+".max_trie_bytes", "must be >= 1024, got %d", *p.MaxTrieBytes)
	}
	if check("session_ttl_secs", p.SessionTTLSecs != nil) && !(*p.SessionTTLSecs > 0) {
		v.addf(key+".session_ttl_secs", "must be > 0, got %v", *p.SessionTTLSecs)
	}
	if check("stale_gap", p.StaleGap != nil) && !(*p.StaleGap >= 0 && *p.StaleGap <= 1) {
		v.addf(key+".stale_gap", "must be between 0 (off) and 1, got %v", *p.StaleGap)
	}
	if check("stale_window", p.StaleWindow != nil) && *p.StaleWindow < 1 {
		v.addf(key+".stale_window", "must be >= 1, got %d", *p.StaleWindow)
	}
	check("home", p.Home != nil)
	if check("overload_margin", p.OverloadMargin != nil) && !(*p.OverloadMargin >= 0 && *p.OverloadMargin <= 1e6) {
		v.addf(key+".overload_margin", "must be between 0 and 1000000, got %v", *p.OverloadMargin)
	}
	if check("hot_window", p.HotWindow != nil) && (*p.HotWindow < 0 || *p.HotWindow > 4096) {
		v.addf(key+".hot_window", "must be between 0 (off) and 4096, got %d", *p.HotWindow)
	}
	if check("overload_factor", p.OverloadFactor != nil) && !(*p.OverloadFactor >= 1 && *p.OverloadFactor <= 1000) {
		v.addf(key+".overload_factor", "must be between 1 and 1000, got %v", *p.OverloadFactor)
	}
	if check("max_sessions", p.MaxSessions != nil) && *p.MaxSessions < 1 {
		v.addf(key+".max_sessions", "must be >= 1, got %d", *p.MaxSessions)
	}
	if check("epsilon", p.Epsilon != nil) && !(*p.Epsilon > 0 && *p.Epsilon <= 10) {
		v.addf(key+".epsilon", "must be in (0, 10], got %v", *p.Epsilon)
	}
	if check("virtual_nodes", p.VirtualNodes != nil) && (*p.VirtualNodes < 1 || *p.VirtualNodes > 4096) {
		v.addf(key+".virtual_nodes", "must be between 1 and 4096, got %d", *p.VirtualNodes)
	}
	if check("key_bytes", p.KeyBytes != nil) && *p.KeyBytes < 1 {
		v.addf(key+".key_bytes", "must be >= 1, got %d", *p.KeyBytes)
	}
	for _, f := range []struct {
		name string
		val  *float64
	}{{"weight_factor", p.WeightFactor}, {"load_factor", p.LoadFactor}, {"cache_factor", p.CacheFactor}} {
		if check(f.name, f.val != nil) && !(*f.val >= 0 && *f.val <= 1000) {
			v.addf(key+"."+f.name, "must be between 0 and 1000, got %v", *f.val)
		}
	}
}

// metricsScrape checks [metrics_scrape]. telemetry.ScrapeConfig.Validate is not used: it checks one
// engine's scrape URL (a base URL, which the section does not have, plus the path) and takes a zero
// interval or timeout to mean its default, where here 0 is an error.
func (v *validator) metricsScrape(m *ScrapeConfig) {
	v.positive("metrics_scrape.interval_secs", m.IntervalSecs)
	v.positive("metrics_scrape.timeout_secs", m.TimeoutSecs)
	if !strings.HasPrefix(m.Path, "/") {
		v.addf("metrics_scrape.path", "path must start with '/', got %q", m.Path)
	}
}

// health checks [health].
func (v *validator) health(h *HealthConfig) {
	if !strings.HasPrefix(h.Path, "/") {
		v.addf("health.path", "path must start with '/', got %q", h.Path)
	}
	v.positive("health.interval_secs", h.IntervalSecs)
	v.positive("health.timeout_secs", h.TimeoutSecs)
	v.positiveInt("health.unhealthy_threshold", h.UnhealthyThreshold)
	v.positiveInt("health.healthy_threshold", h.HealthyThreshold)
	if !(h.MaxEjectionPercent >= 0 && h.MaxEjectionPercent <= 100) {
		v.addf("health.max_ejection_percent", "must be between 0 and 100, got %v", h.MaxEjectionPercent)
	}
}

// cooldown checks [cooldown].
func (v *validator) cooldown(c *CooldownConfig) {
	v.positiveInt("cooldown.failures", c.Failures)
	v.positive("cooldown.window_secs", c.WindowSecs)
	v.positive("cooldown.base_secs", c.BaseSecs)
	v.positive("cooldown.max_secs", c.MaxSecs)
	if c.MaxSecs < c.BaseSecs {
		v.addf("cooldown.max_secs", "max_secs (%v) must be >= base_secs (%v)", c.MaxSecs, c.BaseSecs)
	}
	v.nonNegative("cooldown.max_retry_after_secs", c.MaxRetryAfterSecs)
	v.positiveInt("cooldown.consecutive_5xx", c.Consecutive5xx)
}

// breaker checks [breaker].
func (v *validator) breaker(b *BreakerConfig) {
	v.positiveInt("breaker.failures", b.Failures)
	v.positive("breaker.open_secs", b.OpenSecs)
	v.positiveInt("breaker.half_open_probes", b.HalfOpenProbes)
}

// retry checks [retry].
func (v *validator) retry(r *RetryConfig) {
	if r.MaxRetries < 0 || r.MaxRetries > 10 {
		v.addf("retry.max_retries", "must be between 0 and 10, got %d", r.MaxRetries)
	}
	v.nonNegative("retry.backoff_ms", r.BackoffMs)
	v.nonNegative("retry.max_backoff_ms", r.MaxBackoffMs)
}

// timeouts checks [timeouts].
func (v *validator) timeouts(t *TimeoutsConfig) {
	v.positive("timeouts.connect_secs", t.ConnectSecs)
	v.positive("timeouts.headers_secs", t.HeadersSecs)
	v.positive("timeouts.idle_secs", t.IdleSecs)
}

// queue checks [queue].
func (v *validator) queue(q *QueueConfig) {
	v.nonNegativeInt("queue.max_inflight", q.MaxInflight)
	v.nonNegativeInt("queue.max_inflight_per_target", q.MaxInflightPerTarget)
	v.nonNegativeInt("queue.max_waiting_per_target", q.MaxWaitingPerTarget)
	v.nonNegative("queue.wait_timeout_secs", q.WaitTimeoutSecs)
	v.positive("queue.retry_after_secs", q.RetryAfterSecs)
}

func (v *validator) positive(key string, x float64) {
	if !(x > 0) || math.IsInf(x, 0) {
		v.addf(key, "must be > 0, got %v", x)
	}
}

func (v *validator) nonNegative(key string, x float64) {
	if !(x >= 0) || math.IsInf(x, 0) {
		v.addf(key, "must be >= 0, got %v", x)
	}
}

func (v *validator) positiveInt(key string, x int) {
	if x <= 0 {
		v.addf(key, "must be > 0, got %d", x)
	}
}

func (v *validator) nonNegativeInt(key string, x int) {
	if x < 0 {
		v.addf(key, "must be >= 0, got %d", x)
	}
}

// maxSecs is the longest time.Duration in seconds (about 292 years).
const maxSecs = float64(math.MaxInt64) / float64(time.Second)

// validSecs reports whether s seconds convert to a time.Duration (secs) without overflow.
func validSecs(s float64) bool {
	return math.Abs(s) < maxSecs
}

// kvKeys are the [providers.kv_events] keys that kvindex.SubscriberConfig.Validate names in its errors
// ("cannot use max_blocks 0: ...").
var kvKeys = []string{"endpoint", "replay_endpoint", "mode", "stale_secs", "max_blocks", "allowed_publishers", "curve_secret_key", "curve_client_keys"}

// kvKey returns the key, as ".max_blocks", that an error of kvindex.SubscriberConfig.Validate is about, or
// "" (the table itself) for an error that names none of them.
func kvKey(err error) string {
	msg := err.Error()
	for _, k := range kvKeys {
		if rest, ok := strings.CutPrefix(msg, "cannot use "+k); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, ":")) {
			if k == "curve_secret_key" {
				return ".curve_secret_key_env" // the key is read from the environment variable it names
			}
			return "." + k
		}
	}
	return ""
}

// unjoin returns the errors joined in err (errors.Join), err alone if it joins none, or nothing for nil.
func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func checkHTTPURL(s string) error {
	if s == "" {
		return errors.New("missing URL")
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("cannot parse URL %q: %w", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL %q must start with http:// or https://", s)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("URL %q has no host", s)
	}
	if p := u.Port(); p != "" {
		if _, err := net.LookupPort("tcp", p); err != nil {
			return fmt.Errorf("URL %q has a bad port", s)
		}
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("URL %q must not carry a query, fragment or user info", s)
	}
	return nil
}

// fieldValueFault returns what makes s no RFC 9110 field value (visible characters and obs-text, with
// spaces and tabs between them), or "". A CR or LF would end the header on the wire and start another, or a
// second request.
func fieldValueFault(s string) string {
	if s != "" && (s[0] == ' ' || s[0] == '\t' || s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		return "it starts or ends with whitespace"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Sprintf("it holds a control character (0x%02x) at byte %d; a header value is visible characters, spaces and tabs", c, i)
		}
	}
	return ""
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	switch strings.ToLower(s) {
	case "host", "content-length", "transfer-encoding", "connection":
		return false
	}
	return true
}

func strategyNames() string {
	names := make([]string, 0, len(strategies))
	for n := range strategies {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
