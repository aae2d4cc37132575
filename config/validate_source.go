package config

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/rolter-ai/rolter/egress"
)

// sampleEndpoint is the address a source's provider template is checked with (TEST-NET-1): the template
// must make a valid provider of any address.
var sampleEndpoint = netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, 1}), 8000)

// sources checks [[sources]] and returns the index of each source name.
func (v *validator) sources(ss []SourceConfig, ps []ProviderConfig, allowed []string) map[string]int {
	byName := make(map[string]int, len(ss))
	for i := range ss {
		s := &ss[i]
		key := fmt.Sprintf("sources[%d]", i)
		switch {
		case s.Name == "":
			v.addf(key+".name", "missing source name")
		case strings.ContainsAny(s.Name, "@/ \t\"\\"):
			v.addf(key+".name", "source name %q may not hold '@', '/', quotes, backslashes or spaces", s.Name)
		default:
			if j, dup := byName[s.Name]; dup {
				v.addf(key+".name", "duplicate source name %q (also sources[%d])", s.Name, j)
			}
			byName[s.Name] = i
		}
		switch s.Kind {
		case SourceKubernetes:
			v.kubernetesSource(key, s)
		case SourceDNS:
			v.dnsSource(key, s)
		default:
			v.addf(key+".kind", "unknown source kind %q; want %q or %q", s.Kind, SourceKubernetes, SourceDNS)
		}
		if s.Port < 0 || s.Port > 65535 {
			v.addf(key+".port", "port must be in 1..65535, got %d", s.Port)
		}
		v.nonNegative(key+".settle_secs", s.SettleSecs)
		if s.MaxEndpoints < 1 || s.MaxEndpoints > MaxTargets {
			v.addf(key+".max_endpoints", "max_endpoints must be in 1..%d, got %d", MaxTargets, s.MaxEndpoints)
		}
		v.sourceProvider(key+".provider", s, allowed)
	}
	// A provider of the file or an org named like a source's endpoints would be taken for one of them.
	for i := range ps {
		name := ps[i].Name
		if at := strings.IndexByte(name, '@'); at > 0 && ps[i].Source != name[:at] {
			if _, ok := byName[name[:at]]; ok {
				v.addf(fmt.Sprintf("providers[%d].name", i), "provider name %q is taken by source %q, whose endpoints are named %q",
					name, name[:at], name[:at]+"@<address>:<port>")
			}
		}
	}
	return byName
}

// sourceProvider checks the provider template of source s: it must place the endpoint's address in
// api_base, and the provider it makes of an address must be valid. The addresses themselves are checked
// against [egress] as they are found, and again when they are dialled.
func (v *validator) sourceProvider(key string, s *SourceConfig, allowed []string) {
	if !strings.Contains(s.Provider.APIBase, "{ip}") {
		v.addf(key+".api_base", "a source's api_base must hold {ip} (and usually {port}), got %q", s.Provider.APIBase)
	}
	if kv := s.Provider.KVEvents; kv != nil && kv.Mode == "bind" {
		v.addf(key+".kv_events.mode", "a source's endpoints cannot all bind one address; use mode \"connect\" with an endpoint such as \"tcp://{ip}:5557\"")
	}
	p := s.ProviderFor(EndpointName(s.Name, sampleEndpoint, ""), sampleEndpoint, "", "")
	policy, self := v.policy, v.self
	v.policy, v.self = nil, nil
	v.provider(key, &p, allowed)
	v.policy, v.self = policy, self
}

// kubernetesSource checks [sources.kubernetes].
func (v *validator) kubernetesSource(key string, s *SourceConfig) {
	k := s.Kubernetes
	if k == nil {
		v.addf(key+".kubernetes", "a kubernetes source needs [sources.kubernetes] with service, selector or inference_pool")
		return
	}
	if s.DNS != nil {
		v.addf(key+".dns", "a kubernetes source takes no [sources.dns]")
	}
	n := 0
	for _, set := range []string{k.Service, k.Selector, k.InferencePool} {
		if set != "" {
			n++
		}
	}
	if n != 1 {
		v.addf(key+".kubernetes", "set exactly one of service, selector and inference_pool, got %d", n)
	}
	if k.Selector != "" && s.Port == 0 {
		v.addf(key+".port", "a source of pods by selector needs the engines' port")
	}
	if k.PortName != "" && k.Service == "" {
		v.addf(key+".kubernetes.port_name", "port_name picks an EndpointSlice port: it needs service")
	}
	v.positive(key+".kubernetes.resync_secs", k.ResyncSecs)
	if k.Kubeconfig != "" {
		v.readable(key+".kubernetes.kubeconfig", k.Kubeconfig)
	}
}

// dnsSource checks [sources.dns].
func (v *validator) dnsSource(key string, s *SourceConfig) {
	d := s.DNS
	if d == nil {
		v.addf(key+".dns", "a dns source needs [sources.dns] with name and record")
		return
	}
	if s.Kubernetes != nil {
		v.addf(key+".kubernetes", "a dns source takes no [sources.kubernetes]")
	}
	if d.Name == "" {
		v.addf(key+".dns.name", "missing the name to resolve")
	}
	switch d.Record {
	case RecordSRV:
	case RecordA:
		if s.Port == 0 {
			v.addf(key+".port", "A and AAAA records carry no port: set the engines' port")
		}
	default:
		v.addf(key+".dns.record", "unknown record %q; want %q or %q", d.Record, RecordSRV, RecordA)
	}
	if d.Resolver != "" {
		if host, port := egress.SplitHostPort(d.Resolver); host == "" || port == "" {
			v.addf(key+".dns.resolver", "resolver must be host:port, got %q", d.Resolver)
		}
	}
	v.positive(key+".dns.min_ttl_secs", d.MinTTLSecs)
	v.positive(key+".dns.max_ttl_secs", d.MaxTTLSecs)
	if d.MinTTLSecs > d.MaxTTLSecs {
		v.addf(key+".dns.min_ttl_secs", "min_ttl_secs (%v) is above max_ttl_secs (%v)", d.MinTTLSecs, d.MaxTTLSecs)
	}
	v.positive(key+".dns.timeout_secs", d.TimeoutSecs)
}
