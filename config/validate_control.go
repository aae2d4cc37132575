package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/accesslog"
	"github.com/rolter-ai/rolter/tracing"
)

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
	v.tls("control", c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile, c.TLSMinVersion)
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
