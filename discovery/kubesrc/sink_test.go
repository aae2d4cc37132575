package kubesrc

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
)

// sink records what a watcher reports.
type sink struct {
	mu      sync.Mutex
	sets    [][]discovery.Endpoint
	fails   []error
	failed  bool // the last report was a failure
	changed chan struct{}
}

func newSink() *sink { return &sink{changed: make(chan struct{}, 1)} }

func (s *sink) Set(eps []discovery.Endpoint) {
	s.mu.Lock()
	s.sets = append(s.sets, eps)
	s.failed = false
	s.mu.Unlock()
	s.signal()
}

func (s *sink) Fail(err error) {
	s.mu.Lock()
	s.fails = append(s.fails, err)
	s.failed = true
	s.mu.Unlock()
	s.signal()
}

func (s *sink) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// last is the last set reported, whether one was, and the failures so far.
func (s *sink) last() ([]discovery.Endpoint, bool, []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.sets) == 0 {
		return nil, false, slices.Clone(s.fails)
	}
	return s.sets[len(s.sets)-1], true, slices.Clone(s.fails)
}

func (s *sink) setCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sets)
}

// waitFor waits until cond holds of what the sink has seen, and fails the test after 20s saying what.
func (s *sink) waitFor(t testing.TB, what string, cond func(last []discovery.Endpoint, set bool, fails []error) bool) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		last, set, fails := s.last()
		if cond(last, set, fails) {
			return
		}
		select {
		case <-s.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("no %s after 20s; last set (set %v):\n%s\nfailures: %v", what, set, formatEndpoints(last), fails)
		}
	}
}

// waitSet waits until the last set reported is want, in order.
func (s *sink) waitSet(t testing.TB, want ...discovery.Endpoint) {
	t.Helper()
	sortEndpoints(want)
	s.waitFor(t, "set\n"+formatEndpoints(want), func(last []discovery.Endpoint, set bool, _ []error) bool {
		return set && slices.Equal(last, want) && !s.isFailed()
	})
}

func (s *sink) isFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// waitFail waits until a failure whose text holds every one of parts is reported.
func (s *sink) waitFail(t testing.TB, parts ...string) error {
	t.Helper()
	var got error
	s.waitFor(t, fmt.Sprintf("failure with %q", parts), func(_ []discovery.Endpoint, _ bool, fails []error) bool {
		for _, err := range fails {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(err.Error(), p)
			}
			if ok {
				got = err
				return true
			}
		}
		return false
	})
	return got
}

func formatEndpoints(eps []discovery.Endpoint) string {
	var b strings.Builder
	for _, e := range eps {
		fmt.Fprintf(&b, "  %+v\n", e)
	}
	if len(eps) == 0 {
		b.WriteString("  (none)\n")
	}
	return b.String()
}

// endpoint is pod's endpoint on port as the watcher should report it, its KV events and LMCache
// endpoints from the default annotations.
func endpoint(pod *corev1.Pod, port uint16, ready, terminating bool) discovery.Endpoint {
	return discovery.Endpoint{
		Addr:        netip.AddrPortFrom(netip.MustParseAddr(pod.Status.PodIP), port),
		UID:         string(pod.UID),
		Name:        pod.Name,
		Ready:       ready,
		Terminating: terminating,
		KVEvents:    pod.Annotations["rolter.ai/kv-events"],
		LMCache:     pod.Annotations["rolter.ai/lmcache"],
	}
}

// source is a kubernetes source in ns, with [[sources]]'s defaults.
func source(ns string, kc config.KubernetesSource, port int) *config.SourceConfig {
	kc.Namespace = ns
	if kc.ResyncSecs == 0 {
		kc.ResyncSecs = 300
	}
	if kc.KVEventsAnnotation == "" {
		kc.KVEventsAnnotation = "rolter.ai/kv-events"
	}
	if kc.LMCacheAnnotation == "" {
		kc.LMCacheAnnotation = "rolter.ai/lmcache"
	}
	return &config.SourceConfig{Name: "engines", Kind: config.SourceKubernetes, Kubernetes: &kc, Port: port}
}

// startWatch runs a watcher of sc as cfg's user until the test ends, and checks that Watch then returns.
func startWatch(t testing.TB, sc *config.SourceConfig, cfg *rest.Config) *sink {
	t.Helper()
	w, err := New(sc, Options{Config: cfg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := newSink()
	stop := run(w, s)
	t.Cleanup(func() {
		if !stop(10 * time.Second) {
			t.Error("Watch has not returned 10s after its context was cancelled")
		}
	})
	return s
}

// run runs w.Watch into s; the function it returns cancels it and reports whether Watch returned within
// the time given.
func run(w *Watcher, s discovery.Sink) func(time.Duration) bool {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Watch(ctx, s)
	}()
	return func(d time.Duration) bool {
		cancel()
		select {
		case <-done:
			return true
		case <-time.After(d):
			return false
		}
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}
