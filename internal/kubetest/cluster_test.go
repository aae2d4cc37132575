package kubetest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(code)
}

var readRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get", "list", "watch"}},
}

// A pod gets the status a kubelet would write, and its endpoint the conditions the EndpointSlice
// controller would.
func TestPodAndEndpointSlice(t *testing.T) {
	c := Shared(t)
	ns := c.Namespace(t)
	pod := c.CreatePod(t, ns, Pod{Name: "a", IP: "10.1.0.1", Ready: true, Labels: map[string]string{"app": "vllm"}})
	if pod.Status.PodIP != "10.1.0.1" || pod.Status.Phase != corev1.PodRunning || !podReady(pod) || pod.UID == "" {
		t.Fatalf("pod status %+v", pod.Status)
	}
	ep := EndpointOf(pod)
	if !*ep.Conditions.Ready || !*ep.Conditions.Serving || *ep.Conditions.Terminating || ep.TargetRef.UID != pod.UID {
		t.Fatalf("endpoint of a ready pod %+v", ep)
	}
	s := c.CreateEndpointSlice(t, EndpointSlice(ns, "vllm", "vllm-1", []discoveryv1.EndpointPort{Port("http", 8000)}, ep))
	if s.Labels[discoveryv1.LabelServiceName] != "vllm" || len(s.Endpoints) != 1 {
		t.Fatalf("slice %+v", s)
	}

	pod = c.SetPodReady(t, ns, "a", false)
	if podReady(pod) {
		t.Fatal("pod still ready")
	}
	pod = c.TerminatePod(t, ns, "a")
	ep = EndpointOf(pod)
	if *ep.Conditions.Ready || *ep.Conditions.Serving || !*ep.Conditions.Terminating {
		t.Fatalf("endpoint of a terminating pod %+v", ep.Conditions)
	}
	s.Endpoints = []discoveryv1.Endpoint{ep}
	c.UpdateEndpointSlice(t, s)
	c.RemovePod(t, ns, "a")
	if _, err := c.Clientset.CoreV1().Pods(ns).Get(context.Background(), "a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("removed pod: %v", err)
	}
}

// The reader may read what its Role grants in its namespace and nothing else; the nobody user may read
// nothing. A kubeconfig written for the reader carries its namespace.
func TestReader(t *testing.T) {
	c := Shared(t)
	ns, other := c.Namespace(t), c.Namespace(t)
	ctx := context.Background()
	f := func(cs *kubernetes.Clientset, ns string, wantForbidden bool) {
		t.Helper()
		_, err := cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		if apierrors.IsForbidden(err) != wantForbidden {
			t.Fatalf("list endpointslices in %q: %v; want forbidden %v", ns, err, wantForbidden)
		}
	}
	reader := kubernetes.NewForConfigOrDie(c.Reader(t, ns, readRules...))
	f(reader, ns, false)
	f(reader, other, true)
	f(kubernetes.NewForConfigOrDie(c.UserConfig(NobodyUser)), ns, true)
	_, err := reader.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}},
	}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), ReaderUser) {
		t.Fatalf("reader creates a pod: %v", err)
	}

	path := c.Kubeconfig(t, c.UserConfig(ReaderUser), ns)
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(&clientcmd.ClientConfigLoadingRules{ExplicitPath: path}, nil)
	if got, _, err := loader.Namespace(); err != nil || got != ns {
		t.Fatalf("kubeconfig namespace %q, %v; want %q", got, err, ns)
	}
	cfg, err := loader.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	f(kubernetes.NewForConfigOrDie(cfg), ns, false)
}

// Both InferencePool CRDs install, serve their versions, and take a pool of the shape the inference
// extension documents.
func TestInstallCRD(t *testing.T) {
	c := Shared(t)
	ns := c.Namespace(t)
	f := func(crd []byte, gvr schema.GroupVersionResource, spec map[string]any) {
		t.Helper()
		c.InstallCRD(t, crd)
		c.InstallCRD(t, crd) // a second time leaves it be
		pool := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": gvr.Group + "/" + gvr.Version, "kind": "InferencePool",
			"metadata": map[string]any{"name": "pool"}, "spec": spec,
		}}
		if _, err := dynamic.NewForConfigOrDie(c.Config()).Resource(gvr).Namespace(ns).Create(context.Background(), pool, metav1.CreateOptions{}); err != nil {
			t.Fatalf("cannot create a %s pool: %v", gvr.GroupVersion(), err)
		}
	}
	f(InferencePoolV1, schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}, map[string]any{
		"selector":          map[string]any{"matchLabels": map[string]any{"app": "vllm"}},
		"targetPorts":       []any{map[string]any{"number": int64(8000)}},
		"endpointPickerRef": map[string]any{"name": "epp", "port": map[string]any{"number": int64(9002)}},
	})
	f(InferencePoolV1Alpha2, schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencepools"}, map[string]any{
		"selector":         map[string]any{"app": "vllm"},
		"targetPortNumber": int64(8000),
		"extensionRef":     map[string]any{"name": "epp"},
	})
}

// Without a binary the harness says which one is missing, and how to get it.
func TestBinaries(t *testing.T) {
	f := func(apiserver, etcd, want string) {
		t.Helper()
		t.Setenv(APIServerEnv, apiserver)
		t.Setenv(EtcdEnv, etcd)
		_, _, err := binaries()
		if !errors.Is(err, errNoBinaries) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s=%q %s=%q: %v; want errNoBinaries with %q", APIServerEnv, apiserver, EtcdEnv, etcd, err, want)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f("", self, "ROLTER_KUBE_APISERVER is not set (make kube-apiserver builds one)")
	f("/nonexistent/kube-apiserver", self, `ROLTER_KUBE_APISERVER="/nonexistent/kube-apiserver"`)
	f(self, "/nonexistent/etcd", `etcd "/nonexistent/etcd"`)
}
