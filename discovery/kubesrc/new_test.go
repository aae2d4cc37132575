package kubesrc

import (
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/rolter-ai/rolter/config"
)

// New refuses a source it could not watch, saying why.
func TestNewErrors(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	f := func(sc *config.SourceConfig, override *rest.Config, want string) {
		t.Helper()
		_, err := New(sc, Options{Config: override})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("New(%+v): %v; want an error with %q", sc.Kubernetes, err, want)
		}
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	f(&config.SourceConfig{Name: "s", Kind: config.SourceDNS}, cfg, `of kind "dns": not a kubernetes source`)
	f(source("ns", config.KubernetesSource{}, 0), cfg, "cannot watch 0 of service, selector and inference_pool")
	f(source("ns", config.KubernetesSource{Service: "a", Selector: "app=a"}, 0), cfg, "cannot watch 2 of")
	f(source("ns", config.KubernetesSource{Selector: "app in (a"}, 8000), cfg, `cannot parse selector "app in (a"`)
	f(source("ns", config.KubernetesSource{Selector: "app=a"}, 0), cfg, "needs a port in 1..65535, not 0")
	f(source("ns", config.KubernetesSource{Service: "Not_A_Name"}, 0), cfg, `cannot watch service "Not_A_Name"`)
	f(source("ns", config.KubernetesSource{Service: "a", Kubeconfig: "/nonexistent"}, 0), nil, `cannot load kubeconfig "/nonexistent"`)
	f(source("ns", config.KubernetesSource{Service: "a"}, 0), nil, "not in a pod")
}
