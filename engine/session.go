package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/puzpuzpuz/xsync/v3"
	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
)

// sessionID returns the request's session key, which pins a conversation (pipeline's session bindings,
// consistent_hash's ring key): the x-session-id header, else the body's prompt_cache_key (OpenAI's cache
// routing hint, read by the request scanner), else the first of headers - [server] session_headers, the ones
// agent harnesses send of their own - that the request has; nil when none. The result aliases h or bodyKey.
// It does not allocate.
func sessionID(h *fasthttp.RequestHeader, header, bodyKey []byte, headers []string) []byte {
	if id := header; len(id) > 0 {
		return id
	}
	if len(bodyKey) > 0 {
		return bodyKey
	}
	for _, name := range headers {
		if id := h.Peek(name); len(id) > 0 {
			return id
		}
	}
	return nil
}

// sessions binds session keys (sessionID) to the target that served them last, for session_ttl_secs of
// idleness. Reads are lock-free (xsync's Load takes no lock) and refreshing a binding is one atomic store,
// so a request of a known session allocates nothing; a new binding allocates one entry. The table is
// bounded: a janitor drops idle bindings every few seconds and, above max_sessions, the least recently
// used ones; above 1.25 x max_sessions no new binding is made until the janitor has caught up.
type sessions struct {
	ttl   int64 // nanoseconds
	max   int
	table *xsync.MapOf[uint64, *binding]

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type binding struct {
	target   atomic.Int32
	lastUsed atomic.Int64 // unix nanos
}

const (
	defaultSessionTTL  = config.DefaultSessionTTLSecs
	defaultMaxSessions = config.DefaultMaxSessions
)

func newSessions(p config.RouteParams) *sessions {
	s := &sessions{ttl: int64(defaultSessionTTL * float64(time.Second)), max: defaultMaxSessions}
	if p.SessionTTLSecs != nil {
		s.ttl = int64(*p.SessionTTLSecs * float64(time.Second))
	}
	if p.MaxSessions != nil {
		s.max = *p.MaxSessions
	}
	s.table = xsync.NewMapOf[uint64, *binding](xsync.WithPresize(min(s.max, 1<<16)))
	return s
}

func sessionKey(id []byte) uint64 { return xxhash.Sum64(id) }

// lookup returns the target bound to id if the binding is fresh at now, refreshing it.
func (s *sessions) lookup(id []byte, now int64) (int, bool) {
	b, ok := s.table.Load(sessionKey(id))
	if !ok || now-b.lastUsed.Load() >= s.ttl {
		return 0, false
	}
	b.lastUsed.Store(now)
	return int(b.target.Load()), true
}

// bind records that id went to target at now.
func (s *sessions) bind(id []byte, target int, now int64) {
	k := sessionKey(id)
	if b, ok := s.table.Load(k); ok {
		b.target.Store(int32(target))
		b.lastUsed.Store(now)
		return
	}
	if s.table.Size() >= s.max+s.max/4 {
		return // over the hard cap: route without binding until the janitor prunes
	}
	b := &binding{}
	b.target.Store(int32(target))
	b.lastUsed.Store(now)
	s.table.Store(k, b)
}

func (s *sessions) size() int { return s.table.Size() }

// takeOver copies the bindings of old (a reload's previous table) whose target still exists: index maps an
// old target index to the new one, or -1 when that target is gone.
func (s *sessions) takeOver(old *sessions, index func(int) int) {
	old.table.Range(func(k uint64, b *binding) bool {
		if t := index(int(b.target.Load())); t >= 0 && s.table.Size() < s.max {
			nb := &binding{}
			nb.target.Store(int32(t))
			nb.lastUsed.Store(b.lastUsed.Load())
			s.table.Store(k, nb)
		}
		return true
	})
}

// prune drops bindings idle for ttl and, above max, the least recently used ones.
func (s *sessions) prune(now int64) {
	var live []int64
	s.table.Range(func(k uint64, b *binding) bool {
		if now-b.lastUsed.Load() >= s.ttl {
			s.table.Delete(k)
		} else if s.table.Size() > s.max {
			live = append(live, b.lastUsed.Load())
		}
		return true
	})
	if excess := s.table.Size() - s.max; excess > 0 && len(live) > 0 {
		// Find the cut-off time below which excess bindings lie (approximately: concurrent refreshes may
		// move some), then drop them.
		cut := kthSmallest(live, min(excess, len(live))-1)
		s.table.Range(func(k uint64, b *binding) bool {
			if b.lastUsed.Load() <= cut {
				s.table.Delete(k)
			}
			return true
		})
	}
}

// kthSmallest returns the k-th smallest element (0-based) of xs, reordering xs.
func kthSmallest(xs []int64, k int) int64 {
	lo, hi := 0, len(xs)-1
	for lo < hi {
		p := xs[(lo+hi)/2]
		i, j := lo, hi
		for i <= j {
			for xs[i] < p {
				i++
			}
			for xs[j] > p {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return xs[k]
		}
	}
	return xs[k]
}

func (s *sessions) start(log func(string, ...any)) {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer func() {
			if r := recover(); r != nil {
				log("BUG: panic in the session janitor", "panic", r)
			}
		}()
		every := min(time.Duration(s.ttl)/2, 5*time.Second)
		t := time.NewTicker(max(every, 10*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				s.prune(now.UnixNano())
			}
		}
	}()
}

func (s *sessions) stop() {
	if s.cancel != nil {
		s.cancel()
		s.wg.Wait()
	}
}
