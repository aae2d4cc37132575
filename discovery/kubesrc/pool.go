package kubesrc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// The InferencePool APIs of the Gateway API Inference Extension, newest first: v1 (selector.matchLabels,
// targetPorts[].number) and the experimental v1alpha2 before it (selector, targetPortNumber).
var (
	poolV1       = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}
	poolV1Alpha2 = schema.GroupVersionResource{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencepools"}
)

// poolSpec is what the watcher follows of an InferencePool: the pods it selects and their port.
type poolSpec struct {
	selector string // a label selector, in its canonical string form
	port     uint16
}

// poolAPI picks the InferencePool API the server serves, v1 first. It reads discovery through the REST
// client itself, where client-go's discovery client takes no context and would outlast a Watch.
func poolAPI(ctx context.Context, client rest.Interface) (schema.GroupVersionResource, error) {
	for _, gvr := range []schema.GroupVersionResource{poolV1, poolV1Alpha2} {
		raw, err := client.Get().AbsPath("/apis", gvr.Group, gvr.Version).SetHeader("Accept", "application/json").Do(ctx).Raw()
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return schema.GroupVersionResource{}, fmt.Errorf("cannot ask the API server whether it serves %s: %w", gvr.GroupVersion(), err)
		}
		var list metav1.APIResourceList
		if err := json.Unmarshal(raw, &list); err != nil {
			return schema.GroupVersionResource{}, fmt.Errorf("cannot read the API server's resources of %s: %w", gvr.GroupVersion(), err)
		}
		for _, r := range list.APIResources {
			if r.Name == gvr.Resource {
				return gvr, nil
			}
		}
	}
	return schema.GroupVersionResource{}, fmt.Errorf("the API server serves no InferencePool: neither %s nor %s (install the Gateway API Inference Extension's CRDs)",
		poolV1.GroupVersion(), poolV1Alpha2.GroupVersion())
}

// parsePool reads the selector and port of pool, an object of api.
func parsePool(api schema.GroupVersionResource, pool *unstructured.Unstructured) (poolSpec, error) {
	var (
		match map[string]string
		port  int64
		err   error
	)
	if api == poolV1 {
		match, err = nestedMap(pool, "spec", "selector", "matchLabels")
		if err == nil {
			port, err = firstTargetPort(pool)
		}
	} else {
		match, err = nestedMap(pool, "spec", "selector")
		if err == nil {
			port, err = nestedPort(pool.Object, "spec", "targetPortNumber")
		}
	}
	if err != nil {
		return poolSpec{}, fmt.Errorf("cannot read InferencePool %q (%s): %w", pool.GetName(), api.GroupVersion(), err)
	}
	sel, err := labels.ValidatedSelectorFromSet(match)
	if err != nil {
		return poolSpec{}, fmt.Errorf("cannot read InferencePool %q (%s): its selector: %w", pool.GetName(), api.GroupVersion(), err)
	}
	return poolSpec{selector: sel.String(), port: uint16(port)}, nil
}

// nestedMap is the label map at fields; an empty one would select every pod in the namespace, which no
// pool means (v1 requires at least one label).
func nestedMap(pool *unstructured.Unstructured, fields ...string) (map[string]string, error) {
	m, found, err := unstructured.NestedStringMap(pool.Object, fields...)
	if err != nil {
		return nil, err
	}
	if !found || len(m) == 0 {
		return nil, fmt.Errorf("no labels in .%s", strings.Join(fields, "."))
	}
	return m, nil
}

// firstTargetPort is v1's spec.targetPorts[0].number: a pool of several ports is followed on its first.
func firstTargetPort(pool *unstructured.Unstructured) (int64, error) {
	ports, found, err := unstructured.NestedSlice(pool.Object, "spec", "targetPorts")
	if err != nil {
		return 0, err
	}
	if !found || len(ports) == 0 {
		return 0, errors.New("no .spec.targetPorts")
	}
	first, ok := ports[0].(map[string]any)
	if !ok {
		return 0, errors.New(".spec.targetPorts[0] is not an object")
	}
	port, err := nestedPort(first, "number")
	if err != nil {
		return 0, fmt.Errorf(".spec.targetPorts[0]: %w", err)
	}
	return port, nil
}

func nestedPort(obj map[string]any, fields ...string) (int64, error) {
	port, found, err := unstructured.NestedInt64(obj, fields...)
	if err != nil {
		return 0, err
	}
	if !found || port < 1 || port > 65535 {
		return 0, fmt.Errorf("no port in 1..65535 at .%s", strings.Join(fields, "."))
	}
	return port, nil
}

// watchPool follows the InferencePool, and the pods its selector picks on its port, until ctx is done. When
// the pool's selector or port changes, the watcher follows the new pods, reporting the old set until it
// has listed them.
func (w *Watcher) watchPool(ctx context.Context, r *reporter) {
	api, ok := w.waitPoolAPI(ctx, r)
	if !ok {
		return
	}
	changed := make(chan struct{}, 1)
	name := w.kc.InferencePool
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	poolsAPI := w.dynamic.Resource(api).Namespace(w.ns)
	pool := startFeed(ctx, fmt.Sprintf("InferencePool %q (%s) in namespace %q", name, api.GroupVersion(), w.ns), lister{
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = byName
			return poolsAPI.List(ctx, o)
		},
		watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = byName
			return poolsAPI.Watch(ctx, o)
		},
	}, &unstructured.Unstructured{}, r, changed)
	defer pool.stop()

	var (
		pods *feed
		cur  poolSpec
	)
	stopPods := func() {
		if pods != nil {
			pods.stop()
			pods = nil
		}
	}
	defer stopPods()
	loop(ctx, changed, func() bool {
		if !pool.synced() {
			return true
		}
		obj, found, _ := pool.inf.GetStore().GetByKey(w.ns + "/" + name)
		u, isPool := obj.(*unstructured.Unstructured)
		if !found || !isPool {
			stopPods()
			r.fail(fmt.Errorf("cannot find InferencePool %q (%s) in namespace %q", name, api.GroupVersion(), w.ns))
			return false
		}
		spec, err := parsePool(api, u)
		if err != nil {
			stopPods()
			r.fail(err)
			return false
		}
		if pods == nil || spec != cur {
			stopPods()
			pods, cur = w.podFeed(ctx, spec.selector, r, changed), spec
		}
		if !pods.synced() {
			return true
		}
		r.set(endpointsOfPods(items[*corev1.Pod](pods), cur.port, w.ann))
		return false
	})
}

// waitPoolAPI asks the API server which InferencePool API it serves until it answers one, with backoff,
// reporting each failure; false when ctx is done first.
func (w *Watcher) waitPoolAPI(ctx context.Context, r *reporter) (schema.GroupVersionResource, bool) {
	delay := time.Second
	for {
		api, err := poolAPI(ctx, w.core)
		if err == nil {
			return api, true
		}
		if ctx.Err() != nil {
			return api, false
		}
		r.fail(err)
		select {
		case <-ctx.Done():
			return api, false
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}
