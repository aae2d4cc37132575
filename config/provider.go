package config

import (
	"os"
	"slices"
	"time"

	"github.com/rolter-ai/rolter/kvindex"
)

// ProviderConfig is one upstream engine (a vLLM or SGLang server, or any OpenAI-compatible API).
type ProviderConfig struct {
	// Org owns a provider made through the control plane ("" for the file's); its name is then
	// "<org id>/<name>" here, so orgs never collide.
	Org  string `toml:"-" json:"-"`
	Name string `toml:"name" json:"name"`
	// Source is the discovery source that found the engine ([[sources]]; "" for a provider declared in
	// the file or through the API).
	Source    string            `toml:"-" json:"-"`
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
func (pc *ProviderConfig) EnvOf(name string, allowed []string) string {
	if name == "" || (pc.Org != "" && !slices.Contains(allowed, name)) {
		return ""
	}
	return os.Getenv(name)
}

// apiKey returns the key pc sends upstream as "Bearer <key>" (from its secret or its variable), and
// whether it has one.
func (pc *ProviderConfig) APIKey(allowed []string) (string, bool) {
	switch {
	case pc.APIKeySecret != "":
		return pc.Secrets[pc.APIKeySecret], true
	case pc.APIKeyEnv != "":
		return pc.EnvOf(pc.APIKeyEnv, allowed), true
	}
	return "", false
}

// curveKey returns the CURVE secret key of pc's kv_events ("" when it has none or may not read it).
func (pc *ProviderConfig) CurveKey(allowed []string) string {
	if pc.KVEvents == nil {
		return ""
	}
	return pc.EnvOf(pc.KVEvents.CurveSecretKeyEnv, allowed)
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

// subscriberConfig is c as the KV-event subscriber takes it, with the CURVE secret key curveKey read from
// the variable c names (ProviderConfig.CurveKey); the engine subscribes with the same.
func (c *KVEventsConfig) SubscriberConfig(curveKey string) kvindex.SubscriberConfig {
	sc := kvindex.SubscriberConfig{
		Endpoint:          c.Endpoint,
		Topic:             c.Topic,
		ReplayEndpoint:    c.ReplayEndpoint,
		Mode:              c.Mode,
		StaleAfter:        time.Duration(c.StaleSecs * float64(time.Second)),
		MaxBlocks:         c.MaxBlocks,
		AllowedPublishers: c.AllowedPublishers,
		CurveClientKeys:   c.CurveClientKeys,
		CurveSecretKey:    curveKey,
	}
	return sc
}
