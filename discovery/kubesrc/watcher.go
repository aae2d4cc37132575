// Package kubesrc is the discovery source of kind "kubernetes": it follows, through the API server, the
// EndpointSlices of a Service, the pods a label selector picks, or the pods an InferencePool of the
// Gateway API Inference Extension selects, and reports them to a discovery.Sink as they change.
//
// It needs get, list and watch in its namespace on what it follows: endpointslices (discovery.k8s.io) for
// a Service, and pods for their annotations; pods for a selector; inferencepools
// (inference.networking.k8s.io, or inference.networking.x-k8s.io) and pods for a pool. What it may not
// read it reports to the sink as a failure that names the resource, the verb and the user.
package kubesrc

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
)

// Options are what a Watcher takes besides its source's config.
type Options struct {
	// Logger logs when the source stops and starts seeing its endpoints; nil is slog.Default().
	Logger *slog.Logger
	// Config, when set, is the API server and credentials to use instead of the source's kubeconfig or
	// the pod's service account (tests). The namespace still comes from the source, or its kubeconfig.
	Config *rest.Config
}

// Watcher follows one [[sources]] entry of kind "kubernetes". It is safe for concurrent use: each Watch
// call follows the source on its own.
type Watcher struct {
	name      string
	kc        config.KubernetesSource
	ns        string
	port      uint16          // a selector's pods' port
	selector  labels.Selector // of a selector's pods, or of a Service's slices
	ann       annotations
	resync    time.Duration
	log       *slog.Logger
	http      *http.Client
	core      *rest.RESTClient // core v1: pods, and the API's discovery paths
	slices    *rest.RESTClient // discovery.k8s.io v1: EndpointSlices
	meta      metadata.Interface
	dynamic   dynamic.Interface
	watchMode func(ctx context.Context, r *reporter)
}

var _ discovery.Watcher = (*Watcher)(nil)

// New makes the watcher of sc and the clients it watches with; it asks the API server nothing yet.
func New(sc *config.SourceConfig, opts Options) (*Watcher, error) {
	if sc.Kind != config.SourceKubernetes || sc.Kubernetes == nil {
		return nil, fmt.Errorf("cannot watch source %q of kind %q: not a kubernetes source", sc.Name, sc.Kind)
	}
	kc := sc.Kubernetes
	w := &Watcher{
		name:   sc.Name,
		kc:     *kc,
		ann:    annotations{kvEvents: kc.KVEventsAnnotation, lmcache: kc.LMCacheAnnotation},
		resync: time.Duration(kc.ResyncSecs * float64(time.Second)),
		log:    opts.Logger,
	}
	if w.log == nil {
		w.log = slog.Default()
	}
	w.log = w.log.With("source", sc.Name)
	if w.resync <= 0 {
		w.resync = 5 * time.Minute
	}
	if err := w.pickMode(sc); err != nil {
		return nil, err
	}
	cfg, ns, err := restConfig(kc, opts.Config)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", sc.Name, err)
	}
	w.ns = ns
	if err := w.makeClients(cfg); err != nil {
		return nil, fmt.Errorf("source %q: %w", sc.Name, err)
	}
	return w, nil
}

// pickMode checks that the source names exactly one thing to follow, and what it needs to.
func (w *Watcher) pickMode(sc *config.SourceConfig) error {
	kc := sc.Kubernetes
	n := 0
	for _, s := range []string{kc.Service, kc.Selector, kc.InferencePool} {
		if s != "" {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("source %q: cannot watch %d of service, selector and inference_pool; want exactly one", sc.Name, n)
	}
	var err error
	switch {
	case kc.Service != "":
		if errs := validation.IsDNS1035Label(kc.Service); len(errs) > 0 {
			return fmt.Errorf("source %q: cannot watch service %q: not a Service name: %s", sc.Name, kc.Service, strings.Join(errs, "; "))
		}
		w.selector = labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: kc.Service})
		w.watchMode = w.watchService
	case kc.Selector != "":
		if w.selector, err = labels.Parse(kc.Selector); err != nil {
			return fmt.Errorf("source %q: cannot parse selector %q: %w", sc.Name, kc.Selector, err)
		}
		if sc.Port < 1 || sc.Port > 65535 {
			return fmt.Errorf("source %q: selector %q needs a port in 1..65535, not %d", sc.Name, kc.Selector, sc.Port)
		}
		w.port = uint16(sc.Port)
		w.watchMode = w.watchSelector
	default:
		w.watchMode = w.watchPool
	}
	return nil
}

// makeClients makes the clients of the API server at cfg, all on one HTTP client that Watch closes the
// idle connections of when it returns.
func (w *Watcher) makeClients(cfg *rest.Config) error {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("cannot make a client of %s: %w", cfg.Host, err)
	}
	w.http = hc
	if w.core, err = restClient(cfg, hc, corev1.SchemeGroupVersion, "/api"); err != nil {
		return fmt.Errorf("cannot make a client of %s: %w", cfg.Host, err)
	}
	if w.slices, err = restClient(cfg, hc, discoveryv1.SchemeGroupVersion, "/apis"); err != nil {
		return fmt.Errorf("cannot make a client of %s: %w", cfg.Host, err)
	}
	if w.meta, err = metadata.NewForConfigAndClient(cfg, hc); err != nil {
		return fmt.Errorf("cannot make a client of %s: %w", cfg.Host, err)
	}
	if w.dynamic, err = dynamic.NewForConfigAndClient(cfg, hc); err != nil {
		return fmt.Errorf("cannot make a client of %s: %w", cfg.Host, err)
	}
	return nil
}

// Namespace is the namespace the watcher follows its objects in.
func (w *Watcher) Namespace() string { return w.ns }

// Watch reports the source's endpoints to sink until ctx is done, then returns once every goroutine it
// started has ended.
//
// client-go's own resync replays an informer's cache and asks the server nothing, where resync_secs
// promises a fresh list: so the informers live resync_secs each and are made again, and a new list that
// changes nothing reports nothing.
func (w *Watcher) Watch(ctx context.Context, sink discovery.Sink) {
	defer utilnet.CloseIdleConnectionsFor(w.http.Transport)
	r := newReporter(sink, w.log)
	for ctx.Err() == nil {
		gen, cancel := context.WithTimeout(ctx, w.resync)
		w.watchMode(gen, r)
		cancel()
	}
}

// loop calls step at once and after every change until ctx is done. While step is waiting for an
// informer's first list it is called again every 100ms too: a list that finds nothing signals no event.
func loop(ctx context.Context, changed <-chan struct{}, step func() (waiting bool)) {
	for {
		var poll <-chan time.Time
		if step() {
			poll = time.After(100 * time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-poll:
		}
	}
}

// items is what f's store holds of type T.
func items[T any](f *feed) []T {
	objs := f.inf.GetStore().List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
