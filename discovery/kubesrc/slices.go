package kubesrc

import (
	"fmt"
	"net/netip"
	"sort"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rolter-ai/rolter/discovery"
)

// podMeta finds a pod's metadata by name, nil when it is unknown.
type podMeta func(name string) *metav1.ObjectMeta

// endpointsOfSlices is the set a Service's EndpointSlices describe: every endpoint's address on the port
// named portName (or the slice's only port), ready when the endpoint is ready and not terminating.
// An endpoint in several slices (the controller moves endpoints between slices in two writes) is
// reported once, ready if any of its copies is. pods gives the annotations of the pod an endpoint
// names, nil for none.
func endpointsOfSlices(slices []*discoveryv1.EndpointSlice, service, portName string, pods podMeta, ann annotations) ([]discovery.Endpoint, error) {
	seen := map[discovery.Key]int{}
	var eps []discovery.Endpoint
	for _, s := range slices {
		if s.AddressType != discoveryv1.AddressTypeIPv4 && s.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN endpoints name no address to dial
		}
		port, ok, err := slicePort(s, service, portName)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		for i := range s.Endpoints {
			ep, ok := sliceEndpoint(&s.Endpoints[i], port, pods, ann)
			if !ok {
				continue
			}
			if j, dup := seen[ep.Key()]; dup {
				if ep.Ready && !eps[j].Ready {
					eps[j] = ep
				}
				continue
			}
			seen[ep.Key()] = len(eps)
			eps = append(eps, ep)
		}
	}
	sortEndpoints(eps)
	return eps, nil
}

// slicePort picks the slice's port: the one named portName, or its only one when portName is "". A
// slice without that port (the controller groups endpoints by their port set) has none for the source;
// several ports and no portName is the operator's to settle.
func slicePort(s *discoveryv1.EndpointSlice, service, portName string) (uint16, bool, error) {
	var p *discoveryv1.EndpointPort
	switch {
	case portName != "":
		for i := range s.Ports {
			if s.Ports[i].Name != nil && *s.Ports[i].Name == portName {
				p = &s.Ports[i]
			}
		}
	case len(s.Ports) == 1:
		p = &s.Ports[0]
	case len(s.Ports) > 1:
		names := make([]string, 0, len(s.Ports))
		for _, sp := range s.Ports {
			if sp.Name != nil {
				names = append(names, *sp.Name)
			}
		}
		return 0, false, fmt.Errorf("cannot pick a port of service %q: its EndpointSlice %q has %d ports %q; set port_name", service, s.Name, len(s.Ports), names)
	}
	// A port of no number means every port of the endpoint: nothing to dial.
	if p == nil || p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
		return 0, false, nil
	}
	return uint16(*p.Port), true, nil
}

// sliceEndpoint is e on port. An endpoint has at least one address and the API defines no meaning for
// any beyond the first (kube-proxy reads only that one), so its first address is the engine's.
func sliceEndpoint(e *discoveryv1.Endpoint, port uint16, pods podMeta, ann annotations) (discovery.Endpoint, bool) {
	if len(e.Addresses) == 0 {
		return discovery.Endpoint{}, false
	}
	addr, err := netip.ParseAddr(e.Addresses[0])
	if err != nil {
		return discovery.Endpoint{}, false
	}
	terminating := e.Conditions.Terminating != nil && *e.Conditions.Terminating
	// A nil ready is unknown, which consumers must read as ready (discovery.k8s.io/v1 EndpointConditions).
	ready := (e.Conditions.Ready == nil || *e.Conditions.Ready) && !terminating
	ep := discovery.Endpoint{Addr: netip.AddrPortFrom(addr.Unmap(), port), Ready: ready, Terminating: terminating}
	if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" {
		ep.UID, ep.Name = string(ref.UID), ref.Name
		if pods != nil {
			// The pod informer may lag the slice: a pod of the same name but another UID is an older one.
			if m := pods(ref.Name); m != nil && (ref.UID == "" || m.UID == ref.UID) {
				ann.apply(&ep, m.Annotations)
			}
		}
	}
	return ep, true
}

// sortEndpoints orders eps by address, then UID: a set's order does not depend on the API server's.
func sortEndpoints(eps []discovery.Endpoint) {
	sort.Slice(eps, func(i, j int) bool {
		if c := eps[i].Addr.Compare(eps[j].Addr); c != 0 {
			return c < 0
		}
		return eps[i].UID < eps[j].UID
	})
}
