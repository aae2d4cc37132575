package kubesrc

import (
	"context"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// feed is one informer: a list and a watch of one kind of object, kept in a store, that signals every
// change on a channel of capacity one (so a burst of events is one wake-up) and reports what it cannot
// list or watch. client-go's reflector reconnects with backoff by itself; feed only says so.
type feed struct {
	what   string // what the feed follows, for errors: `endpointslices of service "vllm" in namespace "ai"`
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
	done   chan struct{} // closed when the informer has stopped
}

// lister lists and watches one kind of object with the options it is given (the selectors its caller
// adds).
type lister struct {
	list  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

// startFeed runs an informer of example's kind from l until ctx is done or stop is called. Every change,
// and every list or watch that succeeds, signals changed: after a failure, that is how the watcher learns
// it sees its objects again even when none changed.
func startFeed(ctx context.Context, what string, l lister, example runtime.Object, rep *reporter, changed chan<- struct{}) *feed {
	signal := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := l.list(ctx, o)
			if err == nil {
				signal()
			}
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := l.watch(ctx, o)
			switch {
			case err == nil:
				signal()
			case ctx.Err() == nil && (utilnet.IsConnectionRefused(err) || apierrors.IsTooManyRequests(err)):
				// The reflector retries these with backoff and tells no error handler: the API server is
				// down or shedding load, which the sink is to know.
				rep.fail(fmt.Errorf("cannot watch %s: %w", what, apiError(err)))
			}
			return w, err
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{ObjectDescription: what})
	// Errors are only returned once the informer has started; it has not.
	_ = inf.SetTransform(strip)
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil || routineWatchEnd(err) {
			return
		}
		rep.fail(fmt.Errorf("cannot list and watch %s: %w", what, apiError(err)))
	})
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { signal() },
		UpdateFunc: func(any, any) { signal() },
		DeleteFunc: func(any) { signal() },
	})
	ctx, cancel := context.WithCancel(ctx)
	f := &feed{what: what, inf: inf, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		inf.RunWithContext(ctx)
	}()
	return f
}

// stop ends the informer and waits until its goroutines have.
func (f *feed) stop() {
	f.cancel()
	<-f.done
}

// synced reports whether the feed's first list is in its store.
func (f *feed) synced() bool { return f.inf.HasSynced() }

// apiError is the API server's answer within err, where there is one: the reflector's wrapping of it
// repeats what the feed's own message says.
func apiError(err error) error {
	var status *apierrors.StatusError
	if errors.As(err, &status) {
		return status
	}
	return err
}

// routineWatchEnd reports whether err ends a watch in the ordinary way, which the reflector answers
// by watching again (a closed stream) or listing again (a resource version compacted away).
func routineWatchEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// strip drops from what the informers keep what no watcher here reads: the server-side apply bookkeeping
// every object carries, often its largest part, and a pod's spec.
func strip(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	if p, ok := obj.(*corev1.Pod); ok {
		p.Spec = corev1.PodSpec{}
	}
	return obj, nil
}
