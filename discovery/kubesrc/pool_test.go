package kubesrc

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// A pool's selector and port, from either API; a pool that selects nothing or names no port is an error.
func TestParsePool(t *testing.T) {
	f := func(api string, spec map[string]any, want poolSpec, wantErr string) {
		t.Helper()
		gvr := poolV1
		if api == "v1alpha2" {
			gvr = poolV1Alpha2
		}
		got, err := parsePool(gvr, &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "p"}, "spec": spec}})
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("%s %v: %v; want an error with %q", api, spec, err, wantErr)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("%s %v: %+v, %v; want %+v", api, spec, got, err, want)
		}
	}
	labels := map[string]any{"app": "vllm", "tier": "a"}
	ports := func(n ...int64) []any {
		var out []any
		for _, p := range n {
			out = append(out, map[string]any{"number": p})
		}
		return out
	}
	f("v1", map[string]any{"selector": map[string]any{"matchLabels": labels}, "targetPorts": ports(8000, 8001)}, poolSpec{"app=vllm,tier=a", 8000}, "")
	f("v1", map[string]any{"selector": map[string]any{"matchLabels": map[string]any{}}, "targetPorts": ports(8000)}, poolSpec{}, "no labels in .spec.selector.matchLabels")
	f("v1", map[string]any{"selector": map[string]any{"matchLabels": labels}}, poolSpec{}, "no .spec.targetPorts")
	f("v1", map[string]any{"selector": map[string]any{"matchLabels": labels}, "targetPorts": ports(0)}, poolSpec{}, "no port in 1..65535 at .number")
	f("v1alpha2", map[string]any{"selector": labels, "targetPortNumber": int64(8000)}, poolSpec{"app=vllm,tier=a", 8000}, "")
	f("v1alpha2", map[string]any{"selector": labels}, poolSpec{}, "no port in 1..65535 at .spec.targetPortNumber")
	f("v1alpha2", map[string]any{"selector": map[string]any{"app": "not a value"}, "targetPortNumber": int64(8000)}, poolSpec{}, "its selector")
}
