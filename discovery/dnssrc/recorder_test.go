package dnssrc

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/discovery"
)

// recorder is a discovery.Sink that keeps what it is told, in order, for a test to wait on.
type recorder struct {
	events chan event
}

// event is one call of a Sink: a Set (err nil) or a Fail.
type event struct {
	set []discovery.Endpoint
	err error
}

var _ discovery.Sink = (*recorder)(nil)

func (r *recorder) Set(eps []discovery.Endpoint) { r.events <- event{set: eps} }
func (r *recorder) Fail(err error)               { r.events <- event{err: err} }

// startWatch runs w.Watch into a new recorder until the test ends, and checks Watch returns then.
func startWatch(t *testing.T, w *Watcher) *recorder {
	t.Helper()
	r := &recorder{events: make(chan event, 10000)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Watch(ctx, r); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Watch did not return 10s after its context was done")
		}
	})
	return r
}

// next returns the next event, failing the test when none comes within d.
func (r *recorder) next(t *testing.T, d time.Duration) event {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(d):
		t.Fatalf("no Set or Fail in %s", d)
		return event{}
	}
}

// nextSet returns the next Set, failing the test on a Fail before it or when none comes within d.
func (r *recorder) nextSet(t *testing.T, d time.Duration) []string {
	t.Helper()
	e := r.next(t, d)
	if e.err != nil {
		t.Fatalf("Fail(%v), want a Set", e.err)
	}
	return describe(t, e.set)
}

// nextFail returns the next Fail's error, failing the test on a Set before it.
func (r *recorder) nextFail(t *testing.T, d time.Duration) error {
	t.Helper()
	e := r.next(t, d)
	if e.err == nil {
		t.Fatalf("Set(%v), want a Fail", describe(t, e.set))
	}
	return e.err
}

// awaitSet waits until a Set of want comes, through other Sets and no Fail, within d.
func (r *recorder) awaitSet(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	var got []string
	for time.Now().Before(deadline) {
		got = r.nextSet(t, time.Until(deadline))
		if slices.Equal(got, want) {
			return
		}
	}
	t.Fatalf("no Set of %q in %s; the last: %q", want, d, got)
}

// quiet fails the test on any event within d.
func (r *recorder) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case e := <-r.events:
		t.Fatalf("got %+v, want nothing for %s", e, d)
	case <-time.After(d):
	}
}

// describe is a set as "name addr:port" lines, checking what every DNS endpoint must be.
func describe(t *testing.T, eps []discovery.Endpoint) []string {
	t.Helper()
	if eps != nil && len(eps) == 0 {
		t.Error("Set of an empty non-nil slice, want nil")
	}
	var out []string
	for _, e := range eps {
		if !e.Ready || e.Terminating || e.UID != "" || e.KVEvents != "" || e.LMCache != "" {
			t.Errorf("endpoint %+v: want Ready, no UID, no overrides", e)
		}
		out = append(out, fmt.Sprintf("%s %s", e.Name, e.Addr))
	}
	if !sortedByAddr(eps) {
		t.Errorf("set %q is not sorted by address, each once", out)
	}
	return out
}

// sortedByAddr reports whether eps are in address order, each address once.
func sortedByAddr(eps []discovery.Endpoint) bool {
	for i := 1; i < len(eps); i++ {
		if eps[i-1].Addr.Compare(eps[i].Addr) >= 0 {
			return false
		}
	}
	return true
}
