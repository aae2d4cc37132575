package engine

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/limits"
)

// A request with a data-plane key is limited by its key's and its org's limits (config.Limits: the
// control plane's, else the file's [limits]), and by each one's limits for its model: call.limit reserves
// a place in flight, one request and its token cost in each before routing - the cost is its prompt's
// tokens, estimated from the prompt key, plus its max_tokens (or [limits] default_max_tokens) - and
// finish settles the reservation on what it used: the answer's usage, else the prompt's estimate plus the
// stream events the client received. A refused request is answered 429 rate_limit_exceeded with
// Retry-After; every answer of a limited request carries OpenAI's x-ratelimit-* headers
// (docs/configuration/limits.md).

// dataKey is a data-plane key as the snapshot knows it.
type dataKey struct {
	org string
	id  string
	lim *scopeSet // the key's limits; nil for none
}

// scopeSet is the limits of a key or an org: its own, and by model.
type scopeSet struct {
	all    *limits.Scope
	models map[string]*limits.Scope
}

// describe is the limits of s in Built's words.
func (s *scopeSet) describe() string {
	if s == nil {
		return "unlimited"
	}
	d := describeScope(s.all)
	for _, m := range slices.Sorted(maps.Keys(s.models)) {
		d += fmt.Sprintf(" %s=%s", m, describeScope(s.models[m]))
	}
	return d
}

func describeScope(s *limits.Scope) string {
	if s == nil {
		return "-"
	}
	var rpm, tpm, conc int64
	if s.Requests != nil {
		rpm = s.Requests.Limit()
	}
	if s.Tokens != nil {
		tpm = s.Tokens.Limit()
	}
	if s.InFlight != nil {
		conc = s.InFlight.Limit()
	}
	return fmt.Sprintf("%d/%d/%d", rpm, tpm, conc)
}

// model returns the scope of model m's requests, or nil. Looking up with string(m) does not allocate.
func (s *scopeSet) model(m []byte) *limits.Scope {
	if s == nil || s.models == nil {
		return nil
	}
	return s.models[string(m)]
}

// scopeBuilder builds a snapshot's scopes. A scope whose subject and limits are those of one of the
// previous snapshot is that one, so a reload does not reset what was used.
type scopeBuilder struct {
	prev, next map[string]*limits.Scope
}

func (b *scopeBuilder) scope(subject string, rpm, tpm, concurrent int64) *limits.Scope {
	if rpm <= 0 && tpm <= 0 && concurrent <= 0 {
		return nil
	}
	sig := subject + "\x00" + strconv.FormatInt(rpm, 10) + "/" + strconv.FormatInt(tpm, 10) + "/" + strconv.FormatInt(concurrent, 10)
	s := b.prev[sig]
	if s == nil {
		s = limits.NewScope(subject, rpm, tpm, concurrent)
	}
	b.next[sig] = s
	return s
}

// set returns the scopes of l for subject, or nil when l limits nothing.
func (b *scopeBuilder) set(subject string, l *config.Limits) *scopeSet {
	if l == nil || l.Zero() {
		return nil
	}
	s := &scopeSet{all: b.scope(subject, l.RPM, l.TPM, l.Concurrent)}
	for m, ml := range l.Models {
		if sc := b.scope(fmt.Sprintf("%s for model %q", subject, m), ml.RPM, ml.TPM, ml.Concurrent); sc != nil {
			if s.models == nil {
				s.models = map[string]*limits.Scope{}
			}
			s.models[m] = sc
		}
	}
	return s
}

// SetLimitShare makes every limit this gateway keeps hold ceil(limit / replicas): one of replicas gateways
// keeping a fleet's limits together, each from its share (the cluster sets it from the replicas it hears
// from, and keeps it while NATS is unreachable). 1, the default, is a gateway alone.
func (g *Gateway) SetLimitShare(replicas int) {
	n := int64(max(replicas, 1))
	g.limitShare.Store(n)
	for _, sc := range g.snap.Load().scopes {
		sc.SetShare(n)
	}
}

// LimitShare is how many gateways this one keeps its limits with (SetLimitShare), 1 alone.
func (g *Gateway) LimitShare() int { return int(max(g.limitShare.Load(), 1)) }

// buildLimits fills s.keys and s.orgLimits from cfg, reusing prev's scopes; share is the gateway's
// (SetLimitShare).
func (s *Snapshot) buildLimits(cfg *config.Config, prev *Snapshot, share int64) {
	b := scopeBuilder{next: map[string]*limits.Scope{}}
	if prev != nil {
		b.prev = prev.scopes
	}
	s.keys = make(map[[32]byte]*dataKey, len(cfg.Keys))
	s.orgLimits = map[string]*scopeSet{}
	orgOf := func(org string) config.OrgLimits { return cfg.OrgLimits[org] }
	for _, k := range cfg.Keys {
		dk := &dataKey{org: k.Org, id: k.ID}
		l := k.Limits
		if l == nil {
			l = orgOf(k.Org).Keys
		}
		if l == nil {
			l = &cfg.Limits.Key
		}
		dk.lim = b.set(fmt.Sprintf("key %q", k.ID), l)
		s.keys[k.Hash] = dk
		if _, done := s.orgLimits[k.Org]; !done {
			ol := orgOf(k.Org).Org
			if ol == nil {
				ol = &cfg.Limits.Org
			}
			s.orgLimits[k.Org] = b.set(fmt.Sprintf("org %q", k.Org), ol)
		}
	}
	for _, sc := range b.next {
		sc.SetShare(max(share, 1))
	}
	s.scopes = b.next
	s.defaultMaxTokens = *cfg.Limits.DefaultMaxTokens
}

// limit reserves the request's cost in the limits of key k and its org for the route's model, before it is
// routed; a refusal is the answer.
func (c *call) limit(k *dataKey, route *Route, model []byte, maxTokens int64) *apiError {
	c.tenant, c.tenantModel = k, route.Model
	r := &c.lim
	r.Reset()
	org := c.snap.orgLimits[k.org]
	if k.lim != nil {
		r.Add(k.lim.all)
		r.Add(k.lim.model(model))
	}
	if org != nil {
		r.Add(org.all)
		r.Add(org.model(model))
	}
	if !r.Limited() {
		return nil
	}
	if maxTokens <= 0 {
		maxTokens = c.snap.defaultMaxTokens
	}
	c.limPrompt = estimateTokens(len(c.key))
	ref, ok := r.Admit(c.start.UnixNano(), c.limPrompt+maxTokens)
	if !ok {
		c.limitRefused = true
		return rateLimited(ref)
	}
	c.limited = true
	return nil
}

// estimateTokens is the tokens of a prompt key of n bytes: about four bytes a token, as English text
// under the common tokenizers, at least one.
func estimateTokens(n int) int64 { return int64(n+3)/4 + 1 }

// settleLimits ends the request's reservation on what it used: the answer's usage when it had one, else the
// prompt's estimate and the stream events the client got (one token each, as vLLM streams). An answer that
// is neither a success nor a stream that delivered events (the client left, the stream broke) used nothing:
// the engine refused or never ran it.
func (c *call) settleLimits(status int) {
	if !c.limited {
		return
	}
	c.limited = false
	var used int64
	if status >= 200 && status < 300 || c.events > 0 {
		used = c.limPrompt + c.events
		if u := c.usage.figures(); u.found {
			used = u.prompt + u.completed
		}
	}
	c.lim.Settle(time.Now().UnixNano(), used)
}

// rateLimited is the answer to a request a limit refused, as OpenAI's: 429, rate_limit_exceeded, and how
// long to wait.
func rateLimited(ref limits.Refusal) *apiError {
	e := &apiError{status: fasthttp.StatusTooManyRequests, typ: typeRateLimit, code: "rate_limit_exceeded"}
	if ref.Wait < 0 {
		e.message = fmt.Sprintf("Rate limit of %s: the request needs %d tokens, more than the limit of %d tokens per minute.",
			ref.Scope.Subject, ref.Asked, ref.Scope.Tokens.Limit())
		e.noRetry = true
		return e
	}
	switch ref.Kind {
	case limits.KindInFlight:
		e.message = fmt.Sprintf("Rate limit reached for %s: %d requests in flight, the limit.", ref.Scope.Subject, ref.Scope.InFlight.Limit())
		e.retryAfterMs = 1000
	case limits.KindRequests:
		e.message = fmt.Sprintf("Rate limit reached for %s on requests per minute: limit %d. Please try again in %s.",
			ref.Scope.Subject, ref.Scope.Requests.Limit(), limits.AppendDuration(nil, ref.Wait))
		e.retryAfterMs = int(max((ref.Wait+999_999)/1_000_000, 1))
	default:
		e.message = fmt.Sprintf("Rate limit reached for %s on tokens per minute: limit %d, requested %d. Please try again in %s.",
			ref.Scope.Subject, ref.Scope.Tokens.Limit(), ref.Asked, limits.AppendDuration(nil, ref.Wait))
		e.retryAfterMs = int(max((ref.Wait+999_999)/1_000_000, 1))
	}
	return e
}

// OpenAI's rate-limit headers, canonical.
var (
	hdrLimitRequests     = []byte("X-Ratelimit-Limit-Requests")
	hdrRemainingRequests = []byte("X-Ratelimit-Remaining-Requests")
	hdrResetRequests     = []byte("X-Ratelimit-Reset-Requests")
	hdrLimitTokens       = []byte("X-Ratelimit-Limit-Tokens")
	hdrRemainingTokens   = []byte("X-Ratelimit-Remaining-Tokens")
	hdrResetTokens       = []byte("X-Ratelimit-Reset-Tokens")
)

// limitHeaders sets OpenAI's x-ratelimit-* headers of a limited request (or one a limit refused: its
// reservation still names the scopes) from the tightest of its scopes now.
func (c *call) limitHeaders(h *fasthttp.ResponseHeader) {
	if !c.lim.Limited() {
		return
	}
	st := c.lim.Status(time.Now().UnixNano())
	var num [24]byte
	set := func(limit, remaining, reset []byte, ls limits.LimitStatus) {
		if ls.Limit == 0 {
			return
		}
		h.SetCanonical(limit, strconv.AppendInt(num[:0], ls.Limit, 10))
		h.SetCanonical(remaining, strconv.AppendInt(num[:0], ls.Remaining, 10))
		h.SetCanonical(reset, limits.AppendDuration(num[:0], ls.Reset))
	}
	set(hdrLimitRequests, hdrRemainingRequests, hdrResetRequests, st.Requests)
	set(hdrLimitTokens, hdrRemainingTokens, hdrResetTokens, st.Tokens)
}

// sseData starts an SSE event's data line.
var sseData = []byte("data:")

// countEvents counts the stream events in b a keyed request's client gets: what it is charged for (and its
// usage counts) when the stream ends without a usage chunk. An event split between two reads is missed, one at most per read.
func (c *call) countEvents(b []byte) {
	if c.tenant != nil && c.sse {
		c.events += int64(bytes.Count(b, sseData))
	}
}
