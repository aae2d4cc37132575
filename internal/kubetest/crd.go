package kubetest

import (
	"context"
	_ "embed"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// The Gateway API Inference Extension's InferencePool CRDs, as its releases ship them (testdata/README.md
// says which).
var (
	//go:embed testdata/inference.networking.k8s.io_inferencepools.yaml
	InferencePoolV1 []byte
	//go:embed testdata/inference.networking.x-k8s.io_inferencepools.yaml
	InferencePoolV1Alpha2 []byte
)

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRD creates the CustomResourceDefinition in manifest (YAML), or leaves the one of its name in
// place, and waits until it is Established and discovery lists its resource in every served version.
func (c *Cluster) InstallCRD(t testing.TB, manifest []byte) {
	t.Helper()
	js, err := yaml.YAMLToJSON(manifest)
	if err != nil {
		t.Fatalf("cannot read the CRD: %v", err)
	}
	crd := &unstructured.Unstructured{}
	if err := crd.UnmarshalJSON(js); err != nil {
		t.Fatalf("cannot read the CRD: %v", err)
	}
	ctx := context.Background()
	crds := c.Dynamic.Resource(crdResource)
	if _, err := crds.Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("cannot create CRD %q: %v", crd.GetName(), err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := c.crdReady(ctx, crd.GetName())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %q is not ready after 30s: %v", crd.GetName(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crdReady says what the CRD of name still lacks: the Established condition, or its resource in
// discovery.
func (c *Cluster) crdReady(ctx context.Context, name string) error {
	got, err := c.Dynamic.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
	established := false
	for _, cond := range conds {
		m, _ := cond.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			established = true
		}
	}
	if !established {
		return fmt.Errorf("not Established")
	}
	group, _, _ := unstructured.NestedString(got.Object, "spec", "group")
	plural, _, _ := unstructured.NestedString(got.Object, "spec", "names", "plural")
	versions, _, _ := unstructured.NestedSlice(got.Object, "spec", "versions")
	for _, v := range versions {
		m, _ := v.(map[string]any)
		if served, _ := m["served"].(bool); !served {
			continue
		}
		gv := group + "/" + fmt.Sprint(m["name"])
		list, err := c.Clientset.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			return fmt.Errorf("discovery of %s: %w", gv, err)
		}
		found := false
		for _, r := range list.APIResources {
			found = found || r.Name == plural
		}
		if !found {
			return fmt.Errorf("discovery of %s lists no %s", gv, plural)
		}
	}
	return nil
}
