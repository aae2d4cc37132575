package kubesrc

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/rolter-ai/rolter/discovery"
)

// reporter passes a watcher's findings to its sink: a set only when it differs from the last one, or when
// a failure came between, so a relist or a resync that changes nothing reports nothing. Safe for
// concurrent use.
type reporter struct {
	sink discovery.Sink
	log  *slog.Logger

	mu     sync.Mutex
	last   []discovery.Endpoint // the sink's: read, never written
	sent   bool
	failed bool
}

func newReporter(sink discovery.Sink, log *slog.Logger) *reporter {
	return &reporter{sink: sink, log: log}
}

// set reports eps, sorted, as the whole set; the sink owns eps from then on.
func (r *reporter) set(eps []discovery.Endpoint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent && !r.failed && slices.Equal(r.last, eps) {
		return
	}
	if r.failed {
		r.log.Info("kubernetes source sees its endpoints again", "endpoints", len(eps))
	}
	r.last, r.sent, r.failed = eps, true, false
	r.sink.Set(eps)
}

// fail reports that the source cannot see its endpoints now; the first failure after a set is logged.
func (r *reporter) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failed {
		r.log.Warn("kubernetes source cannot see its endpoints", "err", err)
	}
	r.failed = true
	r.sink.Fail(err)
}
