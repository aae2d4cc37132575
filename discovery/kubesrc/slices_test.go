package kubesrc

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/internal/kubetest"
)

func boolp(b bool) *bool { return &b }

// An endpoint's conditions give Ready and Terminating as the EndpointSlice API defines them.
func TestSliceEndpointConditions(t *testing.T) {
	f := func(ready, terminating *bool, wantReady, wantTerminating bool) {
		t.Helper()
		e := discoveryv1.Endpoint{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
		got, ok := sliceEndpoint(&e, 8000, nil, annotations{})
		if !ok || got.Ready != wantReady || got.Terminating != wantTerminating {
			t.Fatalf("ready %v terminating %v: got %+v; want ready %v terminating %v", ready, terminating, got, wantReady, wantTerminating)
		}
	}
	f(nil, nil, true, false) // unknown readiness reads as ready
	f(boolp(true), nil, true, false)
	f(boolp(false), nil, false, false)
	f(boolp(true), boolp(false), true, false)
	f(boolp(true), boolp(true), false, true) // publishNotReadyAddresses keeps a terminating endpoint ready
	f(nil, boolp(true), false, true)
	f(boolp(false), boolp(true), false, true)
}

// The set of several slices: deduplicated, ready wins, other address types and port-less slices left
// out, IPv6 kept, annotations only from the pod of the endpoint's UID.
func TestEndpointsOfSlices(t *testing.T) {
	pod := func(name, ip, uid string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(uid)}}
		p.Spec.NodeName = "n"
		p.Status.PodIP = ip
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		return p
	}
	a, b, c := pod("a", "10.0.0.1", "uid-a"), pod("b", "10.0.0.2", "uid-b"), pod("c", "fd00::3", "uid-c")
	http := []discoveryv1.EndpointPort{kubetest.Port("http", 8000)}
	notReadyB := kubetest.EndpointOf(b)
	notReadyB.Conditions.Ready = boolp(false)
	v6 := kubetest.EndpointSlice("ns", "svc", "v6", http, kubetest.EndpointOf(c))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	fqdn := kubetest.EndpointSlice("ns", "svc", "fqdn", http, discoveryv1.Endpoint{Addresses: []string{"engine.example"}})
	fqdn.AddressType = discoveryv1.AddressTypeFQDN
	slices := []*discoveryv1.EndpointSlice{
		kubetest.EndpointSlice("ns", "svc", "s1", http, kubetest.EndpointOf(a), notReadyB),
		kubetest.EndpointSlice("ns", "svc", "s2", http, kubetest.EndpointOf(b)),
		kubetest.EndpointSlice("ns", "svc", "noports", nil, kubetest.EndpointOf(pod("d", "10.0.0.4", "uid-d"))),
		v6, fqdn,
	}
	metas := map[string]*metav1.ObjectMeta{
		"a": {Name: "a", UID: "uid-a", Annotations: map[string]string{"kv": "tcp://a:5557", "lm": "http://a:1"}},
		"b": {Name: "b", UID: "old-b", Annotations: map[string]string{"kv": "tcp://old:5557"}},
	}
	got, err := endpointsOfSlices(slices, "svc", "", func(name string) *metav1.ObjectMeta { return metas[name] }, annotations{kvEvents: "kv", lmcache: "lm"})
	if err != nil {
		t.Fatal(err)
	}
	want := []discovery.Endpoint{
		{Addr: netip.MustParseAddrPort("10.0.0.1:8000"), UID: "uid-a", Name: "a", Ready: true, KVEvents: "tcp://a:5557", LMCache: "http://a:1"},
		{Addr: netip.MustParseAddrPort("10.0.0.2:8000"), UID: "uid-b", Name: "b", Ready: true},
		{Addr: netip.MustParseAddrPort("[fd00::3]:8000"), UID: "uid-c", Name: "c", Ready: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got\n%swant\n%s", formatEndpoints(got), formatEndpoints(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got\n%swant\n%s", formatEndpoints(got), formatEndpoints(want))
		}
	}
}

// Several ports need port_name; a named port missing from a slice leaves the slice out.
func TestSlicePort(t *testing.T) {
	f := func(ports []discoveryv1.EndpointPort, name string, want uint16, wantErr string) {
		t.Helper()
		got, ok, err := slicePort(kubetest.EndpointSlice("ns", "svc", "s", ports), "svc", name)
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("ports %v name %q: err %v; want %q", ports, name, err, wantErr)
			}
			return
		}
		if err != nil || (want != 0) != ok || got != want {
			t.Fatalf("ports %v name %q: %d %v %v; want %d", ports, name, got, ok, err, want)
		}
	}
	http, metrics := kubetest.Port("http", 8000), kubetest.Port("metrics", 9090)
	f([]discoveryv1.EndpointPort{http}, "", 8000, "")
	f([]discoveryv1.EndpointPort{http, metrics}, "", 0, `has 2 ports ["http" "metrics"]; set port_name`)
	f([]discoveryv1.EndpointPort{http, metrics}, "metrics", 9090, "")
	f([]discoveryv1.EndpointPort{http}, "metrics", 0, "")
	f(nil, "", 0, "")
	f([]discoveryv1.EndpointPort{{Name: http.Name}}, "", 0, "") // no number: all ports, nothing to dial
}
