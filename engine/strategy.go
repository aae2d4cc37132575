package engine

import (
	"log/slog"
	"math/rand/v2"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/telemetry"
)

// maxTargets bounds the targets of one route (config.MaxTargets), so per-request scratch is fixed-size and
// eligibility is a uint64 bitmask.
const maxTargets = config.MaxTargets

// Strategy ranks the eligible targets of a route for one request.
//
// Rank writes target indexes (into p.Route.Targets, taken from p.Eligible only) best-first into out and
// returns how many it wrote (at least 1; len(out) >= len(p.Eligible) >= 1) and why it chose the first.
// The engine tries them in order; when retries need more candidates than were written it continues with
// the least-loaded eligible targets not tried yet.
//
// Implementations are safe for concurrent use and must not block, allocate, log, or keep p or out after
// returning: Rank runs on every request's routing path. Ineligible targets are not in p.Eligible, so a
// strategy can never compare them (docs/architecture.md, "Eligibility").
type Strategy interface {
	Rank(p *Pick, out []int) (int, Decision)
}

// Recorder is implemented by strategies that learn from where requests went (the cache-aware ones insert
// the prompt into the winner's trie). Routed is called once per request, when it is sent to its target -
// not when the answer comes back, so the requests of a burst see where the first ones went. It must not
// keep p.
type Recorder interface {
	Routed(p *Pick, target int)
}

// lifecycle is implemented by strategies with background work (session janitors). Start is called when the
// snapshot is published, Stop when it has retired.
type lifecycle interface {
	Start()
	Stop()
}

// Pick is the per-request input of a Strategy. The engine owns it; slices are valid only during Rank/Routed.
type Pick struct {
	Route *Route
	// Eligible lists the indexes of the targets that can take the request (healthy, not cooling down,
	// circuit not open), in target order; EligibleMask has bit i set for each.
	Eligible     []int
	EligibleMask uint64
	// Key is the prompt key (docs/architecture.md, "Prompt key"); its first Opening bytes are the
	// conversation's opening, up to the end of its first user message (0: unknown, take the whole key).
	Key     []byte
	Opening int
	// SessionID is the request's session key, if any: x-session-id, else the body's prompt_cache_key, else
	// the first of [server] session_headers the request has (sessionID).
	SessionID []byte
	// TokenIDs are the ids of x-rolter-vllm-token-ids when the header parsed; TokenIDsState says why not.
	TokenIDs      []uint32
	TokenIDsState tokenIDsState
	// Now is the request's start in unix nanoseconds.
	Now int64

	// Predicted reuse, for the routing evidence (docs/architecture.md, "Routing evidence"): a strategy that
	// scores prefixes sets MatchOf to the prompt's size in its unit (key bytes, or tokens) and Matches[i] to
	// target i's match in that unit for every eligible target. The engine sets MatchOf to 0 before Rank; the
	// entries of targets that are not eligible are left as they were and never read. len(Matches) ==
	// len(Route.Targets).
	Matches []int32
	MatchOf int

	// peers is the evidence other replicas share (nil: none); cps are the key's checkpoints in it, computed
	// on first use (peerMatch) into scratch owned by the request.
	peers   Peers
	cps     []uint64
	cpsDone bool
	// peerM[i] is how many leading key bytes the peers' evidence covers on target i (eligible ones, once
	// cpsDone); peerAny says whether any is above 0.
	peerM   []int32
	peerAny bool

	// Scratch for precise_cache_aware's index lookup, owned by the request.
	kvScratch *kvindex.Scratch
	kvOut     []int
	// tmp is scratch for strategies (capacity maxTargets), owned by the request.
	tmp []int
}

type tokenIDsState uint8

const (
	tokenIDsAbsent tokenIDsState = iota
	tokenIDsOK
	tokenIDsMalformed
)

// Reason says why a strategy chose its first target; it is the x-rolter-decision header and a metric label.
type Reason uint8

const (
	ReasonRoundRobin Reason = iota
	ReasonRandom
	ReasonWeighted
	ReasonLeastLoad
	ReasonPowerOfTwo
	ReasonPrefixHit   // cache strategies: the best-matching target cleared the threshold
	ReasonNoMatch     // cache strategies: nothing cleared the threshold; least load
	ReasonOverloaded  // cache strategies: the best match was overloaded; least load
	ReasonLeastWarmed // cache strategies: no load known; the target with the smallest index
	ReasonSession     // x-session-id binding
	ReasonHash        // consistent hash
	ReasonScore       // pipeline argmax
	ReasonNoTokenIDs  // precise: no x-rolter-vllm-token-ids; least load
	ReasonBadTokenIDs // precise: malformed header ignored; least load
	ReasonUntrusted   // precise: no trusted KV-event stream; least load
	ReasonCacheAvail  // lmcache: chosen by LMCache occupancy
	ReasonFallback    // no target was eligible: fail open to the least-bad one
	ReasonRetry       // a retry went to the next candidate
	ReasonHome        // cache strategies: nothing held the prefix; the conversation's rendezvous home
	ReasonBounded     // the strategy's choice was at the route's load bound; the best candidate under it
	numReasons
)

var reasonNames = [numReasons]string{
	"round_robin", "random", "weighted", "least_load", "power_of_two", "prefix_hit", "no_match", "overloaded",
	"least_warmed", "session", "hash", "score", "no_token_ids", "bad_token_ids", "untrusted", "cache_available",
	"fallback", "retry", "home", "load_bound",
}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Decision is a strategy's explanation of its first choice.
type Decision struct {
	Reason Reason
	// Score is the winning prefix-match fraction in 0..1 when a cache strategy decided, else -1.
	Score float64
}

func decide(r Reason) Decision { return Decision{Reason: r, Score: -1} }

// buildFunc builds a route's strategy from its params.
type buildFunc func(r *Route, p config.RouteParams, env *buildEnv) (Strategy, error)

// buildEnv is what snapshot building needs besides the config, and what strategy constructors may use
// besides the route and its params.
type buildEnv struct {
	set    *telemetry.Set // the snapshot's own series
	log    *slog.Logger
	cfg    *config.Config
	dial   dialFunc // tests: in-memory upstreams, no egress policy
	budget *clientconn.Budget
	// egress are the policy's dialers, one per use (useProxy, ...), each counting its own refusals.
	egress [numUses]*egress.Dialer
	// kv is the gateway's KV-event state and kvSources the sources of this snapshot, by provider name.
	kv        *kvState
	kvSources map[string]*kvSource
	// prev is the route of the same model in the snapshot being replaced, if any: a strategy takes over its
	// routing memory (tries, session bindings) for the targets that survive.
	prev *Route
	// trieNodes and trieBytes are the trie ceilings of a target that sets none (trieShare); a shadow's
	// tries always take them.
	trieNodes, trieBytes int
}

// strategies is the name -> constructor table: a plain map, no registration from init functions, so every
// strategy is listed here. config.Strategies names the same ones, with the parameters each takes and what
// it needs, for validation (TestStrategiesMatchConfig).
var strategies = map[string]buildFunc{
	"round_robin":  func(*Route, config.RouteParams, *buildEnv) (Strategy, error) { return &roundRobin{}, nil },
	"random":       func(*Route, config.RouteParams, *buildEnv) (Strategy, error) { return randomPick{}, nil },
	"weighted":     func(r *Route, _ config.RouteParams, _ *buildEnv) (Strategy, error) { return newWeighted(r), nil },
	"least_load":   func(*Route, config.RouteParams, *buildEnv) (Strategy, error) { return leastLoad{}, nil },
	"power_of_two": func(*Route, config.RouteParams, *buildEnv) (Strategy, error) { return powerOfTwo{}, nil },
	"cache_aware": func(r *Route, p config.RouteParams, env *buildEnv) (Strategy, error) {
		s := newCacheAware(r, p, env)
		registerTrieMetrics(env.set, r, s.tries)
		return s, nil
	},
	"pipeline": func(r *Route, p config.RouteParams, env *buildEnv) (Strategy, error) {
		s := newPipeline(r, p, env)
		registerTrieMetrics(env.set, r, s.tries)
		env.set.Gauge(telemetry.Sessions, "route="+telemetry.Label(r.Model), func() float64 { return float64(s.sessions.size()) })
		return s, nil
	},
	"precise_cache_aware": func(r *Route, p config.RouteParams, env *buildEnv) (Strategy, error) {
		s, err := newPrecise(r, p, env)
		if err != nil {
			return nil, err
		}
		registerTrieMetrics(env.set, r, s.tries)
		return s, nil
	},
	"lmcache_aware": func(*Route, config.RouteParams, *buildEnv) (Strategy, error) { return lmcacheAware{}, nil },
	"consistent_hash": func(r *Route, p config.RouteParams, _ *buildEnv) (Strategy, error) {
		return newConsistentHash(r, p), nil
	},
}

// leastLoaded returns the eligible target with the smallest Load, breaking ties uniformly at random so a
// burst of requests at equal load does not all go to the first target (sgl-project/sglang#6164).
func leastLoaded(p *Pick) (best int, minLoad int64) {
	targets := p.Route.Targets
	best, minLoad = -1, 0
	ties := uint64(0)
	for _, i := range p.Eligible {
		l := targets[i].Load()
		switch {
		case best < 0 || l < minLoad:
			best, minLoad, ties = i, l, 1
		case l == minLoad:
			ties++
			if rand.Uint64N(ties) == 0 {
				best = i
			}
		}
	}
	return best, minLoad
}

// matchFraction returns target's predicted match as a fraction of the prompt, -1 when the strategy scored no
// prefixes.
func (p *Pick) matchFraction(target int) float64 {
	if p.MatchOf <= 0 {
		return -1
	}
	return float64(max(p.Matches[target], 0)) / float64(p.MatchOf)
}

// predicted returns the reuse the strategy predicted (MatchOf > 0): the best match over the eligible
// targets (held) and target's (captured; 0 for a target that was not eligible, reached by failing open).
func (p *Pick) predicted(target int) (held, captured int32) {
	for _, i := range p.Eligible {
		held = max(held, p.Matches[i])
	}
	if p.EligibleMask&(1<<target) != 0 {
		captured = max(p.Matches[target], 0)
	}
	return held, captured
}
