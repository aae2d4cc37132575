package kubesrc

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/rolter-ai/rolter/discovery"
)

// annotations names the pod annotations that override an endpoint's KV events and LMCache endpoints;
// "" reads none.
type annotations struct {
	kvEvents string
	lmcache  string
}

func (a annotations) apply(ep *discovery.Endpoint, m map[string]string) {
	if a.kvEvents != "" {
		ep.KVEvents = m[a.kvEvents]
	}
	if a.lmcache != "" {
		ep.LMCache = m[a.lmcache]
	}
}

// endpointsOfPods is the set of pods an engine each on port: ready when the pod's Ready condition is
// true and it is not being deleted. A pod with no IP yet, or one that has run to completion (its IP may
// be another pod's by now), is not an engine.
func endpointsOfPods(pods []*corev1.Pod, port uint16, ann annotations) []discovery.Endpoint {
	var eps []discovery.Endpoint
	for _, p := range pods {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		addr, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil {
			continue
		}
		terminating := p.DeletionTimestamp != nil
		ep := discovery.Endpoint{
			Addr:        netip.AddrPortFrom(addr.Unmap(), port),
			UID:         string(p.UID),
			Name:        p.Name,
			Ready:       podReady(p) && !terminating,
			Terminating: terminating,
		}
		ann.apply(&ep, p.Annotations)
		eps = append(eps, ep)
	}
	sortEndpoints(eps)
	return eps
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
