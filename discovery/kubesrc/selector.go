package kubesrc

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// watchSelector follows the pods of the source's selector until ctx is done.
func (w *Watcher) watchSelector(ctx context.Context, r *reporter) {
	changed := make(chan struct{}, 1)
	pods := w.podFeed(ctx, w.selector.String(), r, changed)
	defer pods.stop()
	loop(ctx, changed, func() bool {
		if !pods.synced() {
			return true
		}
		r.set(endpointsOfPods(items[*corev1.Pod](pods), w.port, w.ann))
		return false
	})
}

// podFeed follows the pods of selector in the watcher's namespace.
func (w *Watcher) podFeed(ctx context.Context, selector string, r *reporter, changed chan<- struct{}) *feed {
	return startFeed(ctx, fmt.Sprintf("pods of selector %q in namespace %q", selector, w.ns),
		resourceLister(w.core, "pods", w.ns, selector, func() runtime.Object { return &corev1.PodList{} }),
		&corev1.Pod{}, r, changed)
}
