package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/rolter-ai/rolter/internal/kubetest"
	"github.com/rolter-ai/rolter/internal/netns"
)

// discoveryRules are what the Helm chart's Role grants the gateway (deploy/helm/rolter/templates/rbac.yaml).
var discoveryRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"inference.networking.k8s.io", "inference.networking.x-k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
}

// kubeSourceConfig is a gateway config whose route m takes its targets from source "vllm" of kind
// kubernetes, selected by sel (`service = "vllm"`, ...), read with kubeconfig in namespace ns.
func kubeSourceConfig(kubeconfig, ns, sel string) string {
	return fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[sources]]
name = "vllm"
kind = "kubernetes"
settle_secs = 0.5
[sources.kubernetes]
kubeconfig = %q
namespace = %q
%s
[sources.provider]
api_base = "http://{ip}:{port}"
[[routes]]
model = "m"
strategy = "cache_aware"
[routes.params]
overload_margin = 16
[[routes.targets]]
source = "vllm"
`, kubeconfig, ns, sel)
}

// TestDiscoveryKubernetesService: the gateway follows a Service's EndpointSlices on a real API server,
// read with the chart's read-only Role, under a bounded load: 2 -> 6 -> 3 endpoints, one terminating in
// the middle of a stream, one deleted, a pod replaced behind a reused address. No request fails, the
// terminating stream completes, new endpoints take traffic within 2 s, the engine that holds a repeated
// prompt keeps its prefix_hit across every change, and the new pod on the reused address starts cold.
func TestDiscoveryKubernetesService(t *testing.T) {
	if !netns.Run(t) {
		return
	}
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	kubeconfig := c.Kubeconfig(t, c.Reader(t, ns, discoveryRules...), ns)
	pods := map[int]*corev1.Pod{}
	for i := 1; i <= 7; i++ {
		pods[i] = c.CreatePod(t, ns, kubetest.Pod{Name: fmt.Sprintf("vllm-%d", i), IP: netns.Addr(i).String(), Ready: true})
	}
	ports := []discoveryv1.EndpointPort{kubetest.Port("http", enginePort)}
	slice := func(idx ...int) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for _, i := range idx {
			eps = append(eps, kubetest.EndpointOf(pods[i]))
		}
		return kubetest.EndpointSlice(ns, "vllm", "vllm-x7k2p", ports, eps...)
	}
	c.CreateEndpointSlice(t, slice(1, 2))

	r := newRig(t, 7, kubeSourceConfig(kubeconfig, ns, `service = "vllm"`))
	r.waitTargets("at start", 1, 2)
	r.load(4)
	rp := r.remember()
	changed := time.Now()
	c.UpdateEndpointSlice(t, slice(1, 2, 3, 4, 5, 6))
	r.grown("2 -> 6", changed, rp, []int{3, 4, 5, 6}, []int{1, 2, 3, 4, 5, 6})

	others := except(6, rp.h)
	keep := []int{rp.h, others[0], others[1]}
	c.UpdateEndpointSlice(t, slice(keep...))
	r.waitTargets("6 -> 3", keep...)
	r.prefixHit("right after 6 -> 3", rp.prompt, rp.home)

	// A stream on an engine that then terminates: it takes no new request, and the stream completes.
	x, done := r.streamOn(func(i int) bool { return i != rp.h && slices.Contains(keep, i) })
	pods[x] = c.TerminatePod(t, ns, pods[x].Name)
	c.UpdateEndpointSlice(t, slice(keep...))
	rest := slices.DeleteFunc(slices.Clone(keep), func(i int) bool { return i == x })
	r.waitTargets("terminating", rest...)
	if st := r.stateOf("vllm", x); st != "terminating" {
		t.Fatalf("the terminating endpoint's state is %q", st)
	}
	r.prefixHit("right after an endpoint terminated", rp.prompt, rp.home)
	if err := <-done; err != nil {
		t.Fatalf("the terminating engine's stream: %v", err)
	}
	c.RemovePod(t, ns, pods[x].Name)

	// Engine 7 joins, then one is deleted.
	y := rest[1]
	c.UpdateEndpointSlice(t, slice(rp.h, y, 7))
	r.waitTargets("one joined", rp.h, y, 7)
	c.UpdateEndpointSlice(t, slice(rp.h, 7))
	r.waitTargets("one deleted", rp.h, 7)
	r.prefixHit("right after a deletion", rp.prompt, rp.home)
	c.RemovePod(t, ns, pods[y].Name)

	// The repeated prompt's pod replaced by a new one on the same address: a new engine, cold.
	c.RemovePod(t, ns, pods[rp.h].Name)
	pods[rp.h] = c.CreatePod(t, ns, kubetest.Pod{Name: fmt.Sprintf("vllm-%d-new", rp.h), IP: netns.Addr(rp.h).String(), Ready: true})
	c.UpdateEndpointSlice(t, slice(rp.h, 7))
	r.replaced(rp, 2)
	r.noneFailed()
}

// TestDiscoveryInferencePool: the gateway follows the pods of a Gateway API Inference Extension
// InferencePool (its CRD installed in a real API server) under a bounded load: pods join (2 -> 5), one
// turns unready, one terminates in the middle of a stream, one is replaced on a reused address. No
// request fails, the stream completes, and the repeated prompt's engine keeps its prefix_hit.
func TestDiscoveryInferencePool(t *testing.T) {
	if !netns.Run(t) {
		return
	}
	c := kubetest.Start(t)
	c.InstallCRD(t, kubetest.InferencePoolV1)
	ns := c.Namespace(t)
	kubeconfig := c.Kubeconfig(t, c.Reader(t, ns, discoveryRules...), ns)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": "llama"},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
			"targetPorts":       []any{map[string]any{"number": int64(enginePort)}},
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
	gvr := schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	if _, err := c.Dynamic.Resource(gvr).Namespace(ns).Create(t.Context(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(i int, name string) *corev1.Pod {
		return c.CreatePod(t, ns, kubetest.Pod{Name: name, IP: netns.Addr(i).String(), Ready: true, Labels: map[string]string{"app": "vllm"}})
	}
	pods := map[int]*corev1.Pod{1: pod(1, "vllm-1"), 2: pod(2, "vllm-2")}
	c.CreatePod(t, ns, kubetest.Pod{Name: "other", IP: netns.Addr(9).String(), Ready: true, Labels: map[string]string{"app": "other"}})

	r := newRig(t, 5, kubeSourceConfig(kubeconfig, ns, `inference_pool = "llama"`))
	r.waitTargets("at start", 1, 2)
	r.load(4)
	rp := r.remember()
	for i := 3; i <= 5; i++ {
		pods[i] = pod(i, fmt.Sprintf("vllm-%d", i))
	}
	changed := time.Now() // the last pod is written: from here on it is the gateway's time
	r.grown("2 -> 5", changed, rp, []int{3, 4, 5}, []int{1, 2, 3, 4, 5})

	others := except(5, rp.h)
	c.SetPodReady(t, ns, pods[others[0]].Name, false)
	r.waitTargets("one unready", rp.h, others[1], others[2], others[3])
	r.prefixHit("right after a pod turned unready", rp.prompt, rp.home)

	x, done := r.streamOn(func(i int) bool { return i == others[1] })
	c.TerminatePod(t, ns, pods[x].Name)
	r.waitTargets("terminating", rp.h, others[2], others[3])
	r.prefixHit("right after a pod terminated", rp.prompt, rp.home)
	if err := <-done; err != nil {
		t.Fatalf("the terminating pod's stream: %v", err)
	}

	c.RemovePod(t, ns, pods[rp.h].Name)
	r.waitTargets("the repeated prompt's pod gone", others[2], others[3])
	pods[rp.h] = pod(rp.h, fmt.Sprintf("vllm-%d-new", rp.h))
	r.replaced(rp, 3)
	r.noneFailed()
}
