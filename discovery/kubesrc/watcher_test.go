package kubesrc

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/internal/kubetest"
)

// The watcher's tests run against a real kube-apiserver and etcd (internal/kubetest), as the user the
// Helm chart's Role makes of the gateway: make test requires them.

func TestMain(m *testing.M) {
	code := m.Run()
	kubetest.StopShared()
	os.Exit(code)
}

// chartRules is what the Helm chart grants the gateway in the namespaces it discovers engines in.
var chartRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"inference.networking.k8s.io", "inference.networking.x-k8s.io"}, Resources: []string{"inferencepools"}, Verbs: []string{"get", "list", "watch"}},
}

// makePods creates pods name-0..name-(n-1), ready, labelled app=label, with IPs 10.<net>.0.<i+1>.
func makePods(t testing.TB, c *kubetest.Cluster, ns, name, label string, net, from, to int) []*corev1.Pod {
	t.Helper()
	var out []*corev1.Pod
	for i := from; i < to; i++ {
		out = append(out, c.CreatePod(t, ns, kubetest.Pod{
			Name: fmt.Sprintf("%s-%d", name, i), IP: fmt.Sprintf("10.%d.0.%d", net, i+1), Ready: true,
			Labels:      map[string]string{"app": label},
			Annotations: map[string]string{"rolter.ai/kv-events": fmt.Sprintf("tcp://10.%d.0.%d:5557", net, i+1)},
		}))
	}
	return out
}

func endpointsOf(ps []*corev1.Pod, port uint16) []discovery.Endpoint {
	var eps []discovery.Endpoint
	for _, p := range ps {
		eps = append(eps, endpoint(p, port, true, false))
	}
	return eps
}

func sliceEndpoints(ps []*corev1.Pod) []discoveryv1.Endpoint {
	var eps []discoveryv1.Endpoint
	for _, p := range ps {
		eps = append(eps, kubetest.EndpointOf(p))
	}
	return eps
}

// A Service's endpoints follow its EndpointSlices: scaled 2 -> 6 (over two slices, one endpoint in both)
// -> 3, an endpoint terminating, one deleted, a pod replaced on the same IP; annotations come from the
// pods.
func TestService(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 1, 0, 6)
	http := []discoveryv1.EndpointPort{kubetest.Port("http", 8000)}
	s := startWatch(t, source(ns, config.KubernetesSource{Service: "vllm"}, 0), c.Reader(t, ns, chartRules...))
	s.waitSet(t) // no slice yet: an empty set

	a := c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "vllm", "vllm-a", http, sliceEndpoints(ps[:2])...))
	s.waitSet(t, endpointsOf(ps[:2], 8000)...)

	// Another Service's slice is not this one's.
	c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "other", "other-a", http, sliceEndpoints(ps[5:])...))

	a.Endpoints = sliceEndpoints(ps[:4])
	a = c.UpdateEndpointSlice(t, a)
	b := c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "vllm", "vllm-b", http, sliceEndpoints(ps[3:6])...))
	s.waitSet(t, endpointsOf(ps, 8000)...)

	a.Endpoints = sliceEndpoints(ps[:3])
	a = c.UpdateEndpointSlice(t, a)
	b.Endpoints = nil
	c.UpdateEndpointSlice(t, b)
	s.waitSet(t, endpointsOf(ps[:3], 8000)...)

	// vllm-2 goes: terminating (not ready, and the controller says so), then gone. vllm-1's readiness is
	// unknown, which reads as ready.
	gone := c.TerminatePod(t, ns, "vllm-2")
	a.Endpoints = append(sliceEndpoints(ps[:2]), kubetest.EndpointOf(gone))
	a.Endpoints[1].Conditions.Ready = nil
	a = c.UpdateEndpointSlice(t, a)
	s.waitSet(t, endpoint(ps[0], 8000, true, false), endpoint(ps[1], 8000, true, false), endpoint(gone, 8000, false, true))

	c.RemovePod(t, ns, "vllm-2")
	a.Endpoints = sliceEndpoints(ps[:2])
	a = c.UpdateEndpointSlice(t, a)
	s.waitSet(t, endpointsOf(ps[:2], 8000)...)

	// vllm-0 is replaced on its IP by a pod of the same name (a StatefulSet's): a new UID, a new engine.
	c.RemovePod(t, ns, "vllm-0")
	again := makePods(t, c, ns, "vllm", "vllm", 1, 0, 1)[0]
	if again.UID == ps[0].UID || again.Status.PodIP != ps[0].Status.PodIP {
		t.Fatalf("BUG: the new pod is %s %s, the old %s %s", again.UID, again.Status.PodIP, ps[0].UID, ps[0].Status.PodIP)
	}
	a.Endpoints = sliceEndpoints([]*corev1.Pod{again, ps[1]})
	c.UpdateEndpointSlice(t, a)
	s.waitSet(t, endpoint(again, 8000, true, false), endpoint(ps[1], 8000, true, false))
	last, _, _ := s.last()
	if last[0].Key() == endpoint(ps[0], 8000, true, false).Key() {
		t.Fatalf("the replaced pod keeps its key %v", last[0].Key())
	}
}

// A Service of several ports needs port_name; with it, each slice gives that port, and a slice without it
// gives nothing.
func TestServicePorts(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 2, 0, 2)
	two := []discoveryv1.EndpointPort{kubetest.Port("metrics", 9090), kubetest.Port("http", 8000)}
	c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "vllm", "vllm-a", two, sliceEndpoints(ps[:1])...))
	c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "vllm", "vllm-b", []discoveryv1.EndpointPort{kubetest.Port("metrics", 9090)}, sliceEndpoints(ps[1:])...))
	reader := c.Reader(t, ns, chartRules...)

	s := startWatch(t, source(ns, config.KubernetesSource{Service: "vllm"}, 0), reader)
	s.waitFail(t, `service "vllm"`, "set port_name")
	if n := s.setCount(); n != 0 {
		t.Fatalf("%d sets reported with no port to pick", n)
	}

	s = startWatch(t, source(ns, config.KubernetesSource{Service: "vllm", PortName: "http"}, 0), reader)
	s.waitSet(t, endpoint(ps[0], 8000, true, false))
}

// A selector's pods are its endpoints on the source's port: scaled 2 -> 6 -> 3, one not ready, one
// terminating, one gone, one replaced on the same IP; pods the selector does not pick are not.
func TestSelector(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 3, 0, 2)
	makePods(t, c, ns, "web", "web", 3, 100, 101)
	s := startWatch(t, source(ns, config.KubernetesSource{Selector: "app in (vllm, sglang)"}, 8000), c.Reader(t, ns, chartRules...))
	s.waitSet(t, endpointsOf(ps, 8000)...)

	ps = append(ps, makePods(t, c, ns, "vllm", "vllm", 3, 2, 6)...)
	s.waitSet(t, endpointsOf(ps, 8000)...)

	for _, p := range ps[3:] {
		c.RemovePod(t, ns, p.Name)
	}
	ps = ps[:3]
	s.waitSet(t, endpointsOf(ps, 8000)...)

	c.SetPodReady(t, ns, "vllm-1", false)
	gone := c.TerminatePod(t, ns, "vllm-2")
	s.waitSet(t, endpoint(ps[0], 8000, true, false), endpoint(ps[1], 8000, false, false), endpoint(gone, 8000, false, true))

	c.RemovePod(t, ns, "vllm-2")
	c.RemovePod(t, ns, "vllm-0")
	again := makePods(t, c, ns, "vllm", "vllm", 3, 0, 1)[0]
	s.waitSet(t, endpoint(again, 8000, true, false), endpoint(ps[1], 8000, false, false))
}

var poolV1Resource = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// pool is an InferencePool of v1 selecting app=app on port.
func poolV1Object(name, app string, port int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": map[string]any{"app": app}},
			"targetPorts":       []any{map[string]any{"number": port}},
			"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
		},
	}}
}

// An InferencePool's endpoints are the pods its selector picks on its first target port; when its
// selector and port change the watcher follows the new ones; a deleted pool is a failure.
func TestInferencePool(t *testing.T) {
	c := kubetest.Shared(t)
	c.InstallCRD(t, kubetest.InferencePoolV1)
	ns := c.Namespace(t)
	as := makePods(t, c, ns, "a", "a", 4, 0, 2)
	bs := makePods(t, c, ns, "b", "b", 4, 10, 13)
	pools := c.Dynamic.Resource(poolV1Resource).Namespace(ns)
	ctx := context.Background()
	s := startWatch(t, source(ns, config.KubernetesSource{InferencePool: "pool"}, 0), c.Reader(t, ns, chartRules...))
	s.waitFail(t, `cannot find InferencePool "pool"`)

	if _, err := pools.Create(ctx, poolV1Object("pool", "a", 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Create(ctx, poolV1Object("other", "b", 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitSet(t, endpointsOf(as, 8000)...)

	as = append(as, makePods(t, c, ns, "a", "a", 4, 2, 3)...)
	s.waitSet(t, endpointsOf(as, 8000)...)

	cur, err := pools.Get(ctx, "pool", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := poolV1Object("pool", "b", 9000)
	next.SetResourceVersion(cur.GetResourceVersion())
	if _, err := pools.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitSet(t, endpointsOf(bs, 9000)...)

	_, _, fails := s.last()
	n := len(fails)
	if err := pools.Delete(ctx, "pool", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitFor(t, "a failure for the deleted pool", func(_ []discovery.Endpoint, _ bool, fails []error) bool { return len(fails) > n })
}

// A cluster that serves only the older inference.networking.x-k8s.io/v1alpha2 InferencePool is followed
// through it. It needs a cluster of its own: the shared one serves v1.
func TestInferencePoolV1Alpha2(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	c := kubetest.Start(t)
	c.InstallCRD(t, kubetest.InferencePoolV1Alpha2)
	ns := c.Namespace(t)
	as := makePods(t, c, ns, "a", "a", 5, 0, 2)
	pool := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferencePool",
		"metadata": map[string]any{"name": "pool"},
		"spec": map[string]any{
			"selector": map[string]any{"app": "a"}, "targetPortNumber": int64(8001),
			"extensionRef": map[string]any{"name": "epp"},
		},
	}}
	gvr := schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencepools"}
	if _, err := c.Dynamic.Resource(gvr).Namespace(ns).Create(context.Background(), pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := startWatch(t, source(ns, config.KubernetesSource{InferencePool: "pool"}, 0), c.Reader(t, ns, chartRules...))
	s.waitSet(t, endpointsOf(as, 8001)...)
}

// A user the Role is not bound to sees nothing, and the failure says what it may not do.
func TestForbidden(t *testing.T) {
	c := kubetest.Shared(t)
	c.InstallCRD(t, kubetest.InferencePoolV1)
	ns := c.Namespace(t)
	makePods(t, c, ns, "vllm", "vllm", 6, 0, 1)
	nobody := c.UserConfig(kubetest.NobodyUser)
	f := func(kc config.KubernetesSource, resource string) {
		t.Helper()
		s := startWatch(t, source(ns, kc, 8000), nobody)
		err := s.waitFail(t, "forbidden", kubetest.NobodyUser, fmt.Sprintf("%q", resource), ns)
		t.Logf("%s", err)
		if n := s.setCount(); n != 0 {
			t.Fatalf("%d sets reported by a watcher that may read nothing", n)
		}
	}
	f(config.KubernetesSource{Service: "vllm"}, "endpointslices")
	f(config.KubernetesSource{Selector: "app=vllm"}, "pods")
	f(config.KubernetesSource{InferencePool: "pool"}, "inferencepools")
}

// A watcher that fails recovers: once the reader is granted the Role, the set comes.
func TestForbiddenThenGranted(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 7, 0, 2)
	s := startWatch(t, source(ns, config.KubernetesSource{Selector: "app=vllm"}, 8000), c.UserConfig(kubetest.ReaderUser))
	s.waitFail(t, "forbidden")
	c.Reader(t, ns, chartRules...)
	s.waitSet(t, endpointsOf(ps, 8000)...)
}

// Every resync_secs the watcher lists again; a list that changes nothing reports nothing, and a change
// made between lists is seen.
func TestResync(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 8, 0, 2)
	s := startWatch(t, source(ns, config.KubernetesSource{Selector: "app=vllm", ResyncSecs: 0.2}, 8000), c.Reader(t, ns, chartRules...))
	s.waitSet(t, endpointsOf(ps, 8000)...)
	time.Sleep(time.Second) // five lists
	if n := s.setCount(); n != 1 {
		t.Fatalf("%d sets of an unchanged set over five lists; want 1", n)
	}
	ps = append(ps, makePods(t, c, ns, "vllm", "vllm", 8, 2, 3)...)
	s.waitSet(t, endpointsOf(ps, 8000)...)
}

// With a kubeconfig and no namespace, the watcher follows the kubeconfig context's namespace.
func TestKubeconfig(t *testing.T) {
	c := kubetest.Shared(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 9, 0, 1)
	path := c.Kubeconfig(t, c.Reader(t, ns, chartRules...), ns)
	sc := source("", config.KubernetesSource{Selector: "app=vllm", Kubeconfig: path}, 8000)
	w, err := New(sc, Options{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if w.Namespace() != ns {
		t.Fatalf("namespace %q; want the kubeconfig's %q", w.Namespace(), ns)
	}
	s := newSink()
	stop := run(w, s)
	defer stop(10 * time.Second)
	s.waitSet(t, endpointsOf(ps, 8000)...)
}

// Watch leaves no goroutine behind: its informers, their watches and its idle connections all end.
func TestWatchLeavesNoGoroutine(t *testing.T) {
	c := kubetest.Shared(t)
	c.InstallCRD(t, kubetest.InferencePoolV1)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 10, 0, 2)
	c.CreateEndpointSlice(t, kubetest.EndpointSlice(ns, "vllm", "vllm-a", []discoveryv1.EndpointPort{kubetest.Port("http", 8000)}, sliceEndpoints(ps)...))
	if _, err := c.Dynamic.Resource(poolV1Resource).Namespace(ns).Create(context.Background(), poolV1Object("pool", "vllm", 8000), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reader := c.Reader(t, ns, chartRules...)
	cycle := func() {
		t.Helper()
		var stops []func(time.Duration) bool
		for _, kc := range []config.KubernetesSource{{Service: "vllm"}, {Selector: "app=vllm"}, {InferencePool: "pool"}} {
			w, err := New(source(ns, kc, 8000), Options{Config: reader, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			s := newSink()
			stops = append(stops, run(w, s))
			s.waitSet(t, endpointsOf(ps, 8000)...)
		}
		for _, stop := range stops {
			if !stop(10 * time.Second) {
				t.Fatal("Watch has not returned 10s after its context was cancelled")
			}
		}
	}
	cycle() // once, for whatever client-go starts once per process
	before := runtime.NumGoroutine()
	cycle()
	const margin = 2
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= before+margin {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines 10s after three watchers returned, %d before them:\n%s", n, before, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// An API server that goes away is a failure; when it is back, the watcher sees what changed meanwhile.
func TestAPIServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster of its own")
	}
	c := kubetest.Start(t)
	ns := c.Namespace(t)
	ps := makePods(t, c, ns, "vllm", "vllm", 11, 0, 2)
	s := startWatch(t, source(ns, config.KubernetesSource{Selector: "app=vllm"}, 8000), c.Reader(t, ns, chartRules...))
	s.waitSet(t, endpointsOf(ps, 8000)...)

	c.StopAPIServer(t)
	err := s.waitFail(t, "connection refused")
	t.Logf("%v", err)
	c.StartAPIServer(t)
	ps = append(ps, makePods(t, c, ns, "vllm", "vllm", 11, 2, 3)...)
	s.waitSet(t, endpointsOf(ps, 8000)...)
}
