package config

import (
	"net/netip"
	"strconv"
	"strings"
)

// SourceConfig is one [[sources]] entry: where a route's targets come from when an operator does not list
// them. Every endpoint the source finds becomes a provider made from Provider, named
// "<source>/<address>:<port>" (and "/<first 8 of its UID>" where the source knows the engine's UID), and a
// target of every route that names the source. Sources are the operator's: only the file declares them,
// and only the file's routes use them.
type SourceConfig struct {
	Name string `toml:"name" json:"name"`
	// Kind is "kubernetes" ([sources.kubernetes]) or "dns" ([sources.dns]).
	Kind       string            `toml:"kind" json:"kind"`
	Kubernetes *KubernetesSource `toml:"kubernetes" json:"kubernetes,omitempty"`
	DNS        *DNSSource        `toml:"dns" json:"dns,omitempty"`
	// Port is the engines' port where the source does not say it: A/AAAA records, pods by selector. An
	// EndpointSlice gives its own (the one named kubernetes.port_name, or its only one), an InferencePool
	// its target port, an SRV record its port.
	Port int `toml:"port" json:"port"`
	// SettleSecs is how long an endpoint must be seen ready before it takes traffic, so a flapping one
	// does not churn the fleet; an endpoint that goes, or stops being ready, leaves at once.
	SettleSecs float64 `toml:"settle_secs" json:"settle_secs"`
	// MaxEndpoints bounds the targets the source gives each route (at most MaxTargets); the ready
	// endpoints beyond it, in address order, are left out and counted in the source's status.
	MaxEndpoints int `toml:"max_endpoints" json:"max_endpoints"`
	// Provider is every endpoint's provider, but for its name. In api_base, kv_events.endpoint,
	// kv_events.replay_endpoint and lmcache.endpoint, "{ip}" is the endpoint's address as a URL holds it
	// (an IPv6 address in brackets) and "{port}" its port.
	Provider ProviderConfig `toml:"provider" json:"provider"`
}

// Source kinds.
const (
	SourceKubernetes = "kubernetes"
	SourceDNS        = "dns"
)

// KubernetesSource is [sources.kubernetes]: exactly one of Service, Selector and InferencePool, in
// Namespace.
type KubernetesSource struct {
	// Kubeconfig is a kubeconfig file; "" uses the pod's service account (in-cluster).
	Kubeconfig string `toml:"kubeconfig" json:"kubeconfig"`
	// Namespace is where the objects are; "" is the kubeconfig context's namespace, or the pod's own.
	Namespace string `toml:"namespace" json:"namespace"`
	// Service follows the EndpointSlices of the Service of that name (label kubernetes.io/service-name):
	// ready, serving and terminating as the endpoints controller sets them.
	Service string `toml:"service" json:"service"`
	// PortName picks the EndpointSlice port by name when the Service has more than one.
	PortName string `toml:"port_name" json:"port_name"`
	// Selector follows the pods that match a label selector ("app=vllm,tier in (a,b)"): a pod is ready
	// when its Ready condition is true and it is not being deleted.
	Selector string `toml:"selector" json:"selector"`
	// InferencePool follows the pods the Gateway API Inference Extension's InferencePool of that name
	// selects, on its target port.
	InferencePool string `toml:"inference_pool" json:"inference_pool"`
	// ResyncSecs is how often the watch lists everything again, whatever it was told.
	ResyncSecs float64 `toml:"resync_secs" json:"resync_secs"`
	// KVEventsAnnotation and LMCacheAnnotation name the pod annotations that override the provider's
	// kv_events.endpoint and lmcache.endpoint for one pod.
	KVEventsAnnotation string `toml:"kv_events_annotation" json:"kv_events_annotation"`
	LMCacheAnnotation  string `toml:"lmcache_annotation" json:"lmcache_annotation"`
}

// DNSSource is [sources.dns]: the records of one name, asked again when their TTL runs out, within
// [MinTTLSecs, MaxTTLSecs].
type DNSSource struct {
	// Name is the name to resolve ("_http._tcp.vllm.default.svc.cluster.local" for SRV,
	// "vllm.default.svc.cluster.local" for A/AAAA).
	Name string `toml:"name" json:"name"`
	// Record is "srv" or "a" (A and AAAA records both).
	Record string `toml:"record" json:"record"`
	// Resolver is the DNS server ("host:port"); "" is the first nameserver of /etc/resolv.conf.
	Resolver    string  `toml:"resolver" json:"resolver"`
	MinTTLSecs  float64 `toml:"min_ttl_secs" json:"min_ttl_secs"`
	MaxTTLSecs  float64 `toml:"max_ttl_secs" json:"max_ttl_secs"`
	TimeoutSecs float64 `toml:"timeout_secs" json:"timeout_secs"`
}

// DNS record kinds.
const (
	RecordSRV = "srv"
	RecordA   = "a"
)

// Defaults of [[sources]].
const (
	defaultSettleSecs         = 1.0
	defaultResyncSecs         = 300.0
	defaultKVEventsAnnotation = "rolter.ai/kv-events"
	defaultLMCacheAnnotation  = "rolter.ai/lmcache"
	defaultDNSMinTTLSecs      = 1.0
	defaultDNSMaxTTLSecs      = 30.0
	defaultDNSTimeoutSecs     = 2.0
)

// setDefaults fills the zero keys of s.
func (s *SourceConfig) setDefaults() {
	if s.SettleSecs == 0 {
		s.SettleSecs = defaultSettleSecs
	}
	if s.MaxEndpoints == 0 {
		s.MaxEndpoints = MaxTargets
	}
	s.Provider.setDefaults()
	if k := s.Kubernetes; k != nil {
		if k.ResyncSecs == 0 {
			k.ResyncSecs = defaultResyncSecs
		}
		if k.KVEventsAnnotation == "" {
			k.KVEventsAnnotation = defaultKVEventsAnnotation
		}
		if k.LMCacheAnnotation == "" {
			k.LMCacheAnnotation = defaultLMCacheAnnotation
		}
	}
	if d := s.DNS; d != nil {
		if d.MinTTLSecs == 0 {
			d.MinTTLSecs = defaultDNSMinTTLSecs
		}
		if d.MaxTTLSecs == 0 {
			d.MaxTTLSecs = defaultDNSMaxTTLSecs
		}
		if d.TimeoutSecs == 0 {
			d.TimeoutSecs = defaultDNSTimeoutSecs
		}
	}
}

// ProviderFor returns the provider of the endpoint at addr: the source's template with "{ip}" and
// "{port}" filled in, named name. kvEvents and lmcache, when not "", replace the endpoints of the
// template's kv_events and lmcache (they come from the endpoint itself, a pod's annotation).
func (s *SourceConfig) ProviderFor(name string, addr netip.AddrPort, kvEvents, lmcache string) ProviderConfig {
	ip := addr.Addr().String()
	if addr.Addr().Is6() {
		ip = "[" + ip + "]"
	}
	fill := strings.NewReplacer("{ip}", ip, "{port}", strconv.Itoa(int(addr.Port())))
	p := s.Provider
	p.Name, p.Source = name, s.Name
	p.APIBase = fill.Replace(p.APIBase)
	if kv := s.Provider.KVEvents; kv != nil {
		c := *kv
		c.Endpoint, c.ReplayEndpoint = fill.Replace(c.Endpoint), fill.Replace(c.ReplayEndpoint)
		if kvEvents != "" {
			c.Endpoint = kvEvents
		}
		p.KVEvents = &c
	}
	if lc := s.Provider.LMCache; lc != nil {
		c := *lc
		c.Endpoint = fill.Replace(c.Endpoint)
		if lmcache != "" {
			c.Endpoint = lmcache
		}
		p.LMCache = &c
	}
	return p
}

// EndpointName is the provider name of the endpoint at addr of source: "<source>@<address>:<port>", and
// "/<the first 8 characters of uid>" when the source knows the engine's UID, so a new engine on a reused
// address is a new target.
func EndpointName(source string, addr netip.AddrPort, uid string) string {
	n := source + "@" + addr.String()
	if uid != "" {
		n += "/" + uid[:min(len(uid), 8)]
	}
	return n
}
