package config

import (
	"slices"

	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/tracing"
)

// Config is the decoded rolter.toml. Field names are the TOML keys (configs/rolter.example.toml). The
// section defaults are Default, which decoding starts from; the defaults of the keys inside arrays of
// tables are set by SetDefaults, before validation. A Config returned by Parse is complete and valid.
type Config struct {
	Server        ServerConfig     `toml:"server" json:"server"`
	Providers     []ProviderConfig `toml:"providers" json:"providers"`
	Routes        []RouteConfig    `toml:"routes" json:"routes"`
	Sources       []SourceConfig   `toml:"sources" json:"sources,omitempty"`
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
	Limits        LimitsConfig     `toml:"limits" json:"limits"`

	// File is the path the config was read from ("" for in-memory configs); used in error messages.
	File string `toml:"-" json:"-"`

	// Keys are the data-plane API keys of the orgs made through the control plane, as keyed hashes:
	// SHA-256(KeyPepper || secret). Set by the control plane, never by the file.
	Keys      []DataKey `toml:"-" json:"-"`
	KeyPepper [32]byte  `toml:"-" json:"-"`
	// OrgLimits are the limits the control plane set on orgs, by org id: their own (Org) and the default of
	// their keys (Keys). An org absent here has the file's [limits].
	OrgLimits map[string]OrgLimits `toml:"-" json:"-"`
}

// OrgLimits are an org's limits as the control plane sets them; nil for none of its own.
type OrgLimits struct {
	Org  *Limits
	Keys *Limits
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
	// TLSCertFile and TLSKeyFile (PEM, both or neither) serve HTTPS on listen; the files are read again
	// when they change (certfile). TLSMinVersion is "1.2" or "1.3".
	TLSCertFile   string `toml:"tls_cert_file" json:"tls_cert_file"`
	TLSKeyFile    string `toml:"tls_key_file" json:"tls_key_file"`
	TLSMinVersion string `toml:"tls_min_version" json:"tls_min_version"`
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
	// ID is the key's id (its usage and metrics name it); Limits its own limits, nil for its org's key
	// default.
	ID     string
	Limits *Limits
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
	// TLSCertFile and TLSKeyFile (PEM, both or neither) serve the control plane over HTTPS; with
	// TLSClientCAFile it also requires a client certificate signed by one of that file's CAs. The files are
	// read again when they change (certfile). TLSMinVersion is "1.2" or "1.3".
	TLSCertFile     string `toml:"tls_cert_file" json:"tls_cert_file"`
	TLSKeyFile      string `toml:"tls_key_file" json:"tls_key_file"`
	TLSClientCAFile string `toml:"tls_client_ca_file" json:"tls_client_ca_file"`
	TLSMinVersion   string `toml:"tls_min_version" json:"tls_min_version"`
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
func (c *ControlConfig) Equal(o *ControlConfig) bool {
	return c.Enabled == o.Enabled && c.Listen == o.Listen && c.Store == o.Store && c.AdminTokenEnv == o.AdminTokenEnv &&
		slices.Equal(c.Hosts, o.Hosts) && c.MaxConns == o.MaxConns && c.ReadTimeoutSecs == o.ReadTimeoutSecs &&
		c.WriteTimeoutSecs == o.WriteTimeoutSecs && c.IdleTimeoutSecs == o.IdleTimeoutSecs &&
		slices.Equal(c.ProviderEnv, o.ProviderEnv) && c.SecretsKeyEnv == o.SecretsKeyEnv &&
		c.TLSCertFile == o.TLSCertFile && c.TLSKeyFile == o.TLSKeyFile && c.TLSClientCAFile == o.TLSClientCAFile &&
		c.TLSMinVersion == o.TLSMinVersion
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

// DocsConfig is [docs]: where the product's documentation is served, for the dashboard's links: an
// http(s) URL, or a path on the control plane's own origin starting with "/"; "" is the control plane's
// own /docs (docs/deployment/documentation-links.md).
type DocsConfig struct {
	BaseURL string `toml:"base_url" json:"base_url"`
}

// TraceConfig is [trace]: the routing trace, one JSON line per request with lengths, hashes and the routing
// decision, never prompt text (the capture package; `rolter replay` reads it).
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
