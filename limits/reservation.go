package limits

// MaxScopes bounds the scopes one request is limited by: its key, its org, and each's limits for its
// model.
const MaxScopes = 4

// Kind is which limit refused a request.
type Kind uint8

const (
	KindRequests Kind = iota + 1 // requests per minute
	KindTokens                   // tokens per minute
	KindInFlight                 // requests in flight
)

func (k Kind) String() string {
	switch k {
	case KindRequests:
		return "requests"
	case KindTokens:
		return "tokens"
	case KindInFlight:
		return "concurrent requests"
	}
	return ""
}

// Refusal is why a request was refused: the scope and limit that refused it, the tokens it asked for, and
// how long until it could pass (nanoseconds, -1 when it never can: it asks more tokens than the limit).
type Refusal struct {
	Scope *Scope
	Kind  Kind
	Asked int64
	Wait  int64
}

// Reservation is what one request holds of its scopes' limits, from Admit to Settle: a place in flight, one
// request, and its token reservation, in each scope. The zero value is empty; a Reservation lives in the
// request's own state (no allocation), and Settle must follow every Admit that succeeded, once.
type Reservation struct {
	scopes   [MaxScopes]*Scope
	n        int
	reserved int64 // tokens taken from each scope's Tokens
	admitted bool
}

// Reset empties r for a new request.
func (r *Reservation) Reset() { *r = Reservation{} }

// Add limits the request by s too (nil: nothing). At most MaxScopes; more are ignored.
func (r *Reservation) Add(s *Scope) {
	if s != nil && r.n < MaxScopes {
		r.scopes[r.n] = s
		r.n++
	}
}

// Limited reports whether any scope limits the request.
func (r *Reservation) Limited() bool { return r.n > 0 }

// Admit reserves, in every scope, a place in flight, one request and tokens tokens at now. When a limit
// refuses, what the scopes before it reserved is given back, and the refusal says which and for how long.
func (r *Reservation) Admit(now, tokens int64) (Refusal, bool) {
	tokens = max(tokens, 0)
	for i := 0; i < r.n; i++ {
		s := r.scopes[i]
		if s.InFlight != nil && !s.InFlight.Acquire() {
			r.undo(now, i, 0, tokens)
			return Refusal{Scope: s, Kind: KindInFlight, Asked: 1}, false
		}
		if s.Requests != nil {
			if ok, wait := s.Requests.Take(now, 1); !ok {
				r.undo(now, i, 1, tokens)
				return Refusal{Scope: s, Kind: KindRequests, Asked: 1, Wait: wait}, false
			}
		}
		if s.Tokens != nil {
			if ok, wait := s.Tokens.Take(now, tokens); !ok {
				r.undo(now, i, 2, tokens)
				return Refusal{Scope: s, Kind: KindTokens, Asked: tokens, Wait: wait}, false
			}
		}
	}
	r.reserved, r.admitted = tokens, true
	return Refusal{}, true
}

// undo gives back what scopes [0, i) reserved, and the first done limits of scope i (1: its place in
// flight, 2: and its request).
func (r *Reservation) undo(now int64, i, done int, tokens int64) {
	for j := 0; j <= i && j < r.n; j++ {
		s := r.scopes[j]
		limits := 3
		if j == i {
			limits = done
		}
		if limits >= 1 && s.InFlight != nil {
			s.InFlight.Release()
		}
		if limits >= 2 && s.Requests != nil {
			s.Requests.Give(now, 1)
		}
		if limits >= 3 && s.Tokens != nil {
			s.Tokens.Give(now, tokens)
		}
	}
}

// Reserved is the tokens the request reserved.
func (r *Reservation) Reserved() int64 { return r.reserved }

// Settle ends an admitted request at now having used used tokens: each scope's place in flight is given
// back, and its tokens bucket gets back what the reservation had over used, or is charged what used had
// over it. The request itself stays counted. Settling twice, or without Admit, does nothing.
func (r *Reservation) Settle(now, used int64) {
	if !r.admitted {
		return
	}
	r.admitted = false
	used = max(used, 0)
	for i := 0; i < r.n; i++ {
		s := r.scopes[i]
		if s.InFlight != nil {
			s.InFlight.Release()
		}
		if s.Tokens == nil {
			continue
		}
		switch {
		case used < r.reserved:
			s.Tokens.Give(now, r.reserved-used)
		case used > r.reserved:
			s.Tokens.Force(now, used-r.reserved)
		}
	}
}

// Status is what the OpenAI rate-limit headers report: for requests and for tokens, the limit (the
// bucket's share of it, all of it on a gateway alone), the remaining and the time until full (nanoseconds)
// of the scope with the least remaining; a zero Limit where no scope limits that.
type Status struct {
	Requests, Tokens LimitStatus
}

// LimitStatus is one line of Status.
type LimitStatus struct {
	Limit, Remaining, Reset int64
}

// Status returns the request's Status at now.
func (r *Reservation) Status(now int64) Status {
	var st Status
	for i := 0; i < r.n; i++ {
		s := r.scopes[i]
		tighter(&st.Requests, s.Requests, now)
		tighter(&st.Tokens, s.Tokens, now)
	}
	return st
}

// tighter makes ls b's status when b has less remaining.
func tighter(ls *LimitStatus, b *Bucket, now int64) {
	if b == nil {
		return
	}
	if rem := b.Remaining(now); ls.Limit == 0 || rem < ls.Remaining {
		*ls = LimitStatus{Limit: b.Share(), Remaining: rem, Reset: b.Reset(now)}
	}
}
