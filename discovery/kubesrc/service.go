package kubesrc

import (
	"context"
	"fmt"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

var podsResource = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// watchService follows the Service's EndpointSlices, and the metadata of the namespace's pods for their
// annotations, until ctx is done.
//
// The pods are followed as metadata only (PartialObjectMetadata: no spec, no status), so the namespace's
// pods cost their names, labels and annotations, on the wire and in memory; without annotation names
// configured no pod is followed at all.
func (w *Watcher) watchService(ctx context.Context, r *reporter) {
	changed := make(chan struct{}, 1)
	sel := w.selector.String()
	slices := startFeed(ctx, fmt.Sprintf("endpointslices of service %q in namespace %q", w.kc.Service, w.ns),
		resourceLister(w.slices, "endpointslices", w.ns, sel, func() runtime.Object { return &discoveryv1.EndpointSliceList{} }),
		&discoveryv1.EndpointSlice{}, r, changed)
	defer slices.stop()

	var pods *feed
	var meta podMeta
	if w.ann != (annotations{}) {
		podsAPI := w.meta.Resource(podsResource).Namespace(w.ns)
		pods = startFeed(ctx, fmt.Sprintf("pods in namespace %q (for their annotations)", w.ns), lister{
			list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return podsAPI.List(ctx, o)
			},
			watch: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return podsAPI.Watch(ctx, o)
			},
		}, &metav1.PartialObjectMetadata{}, r, changed)
		defer pods.stop()
		meta = func(name string) *metav1.ObjectMeta {
			obj, ok, _ := pods.inf.GetStore().GetByKey(w.ns + "/" + name)
			if m, isMeta := obj.(*metav1.PartialObjectMetadata); ok && isMeta {
				return &m.ObjectMeta
			}
			return nil
		}
	}

	loop(ctx, changed, func() bool {
		if !slices.synced() || (pods != nil && !pods.synced()) {
			return true
		}
		eps, err := endpointsOfSlices(items[*discoveryv1.EndpointSlice](slices), w.kc.Service, w.kc.PortName, meta, w.ann)
		if err != nil {
			r.fail(err)
			return false
		}
		r.set(eps)
		return false
	})
}
