package config

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
)

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
		if p.Source == "" {
			// A discovered provider is its source's template, checked once (sourceProvider), with an
			// address filled in, which the fleet checks against [egress].
			v.provider(key, p, allowed)
		}
	}
	v.kvSharedBinds(ps, allowed)
	return byName
}

// provider checks everything of provider p but its name (key: where it is, "providers[3]").
func (v *validator) provider(key string, p *ProviderConfig, allowed []string) {
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
	_, hasKey := p.APIKey(allowed)
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
	if p.EnvOf(name, allowed) == "" {
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

// kvEvents checks [providers.kv_events] by the subscriber's own rules (kvindex.SubscriberConfig.Validate),
// so a config that passes `rolter check` is one the subscriber takes. An org's provider is held to more: no
// ipc:// or inproc:// endpoint (they reach inside the gateway's host and process), and a bind only on a
// port the operator lists in [egress] kv_bind_ports.
func (v *validator) kvEvents(key string, p *ProviderConfig, allowed []string) {
	kv := p.KVEvents
	if kv.CurveSecretKeyEnv != "" {
		v.providerEnv(key+".curve_secret_key_env", p, kv.CurveSecretKeyEnv, allowed)
	}
	sc := kv.SubscriberConfig(p.CurveKey(allowed))
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
// topic and all the same publisher policy; otherwise all but one of them would retry "address already in
// use" forever.
func (v *validator) kvSharedBinds(ps []ProviderConfig, allowed []string) {
	cfgs := make([]*kvindex.SubscriberConfig, len(ps))
	for i := range ps {
		if kv := ps[i].KVEvents; kv != nil {
			sc := kv.SubscriberConfig(ps[i].CurveKey(allowed))
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
