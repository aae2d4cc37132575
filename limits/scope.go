package limits

// Scope is the limits of one subject - a key, an org, or the requests of one model of either: requests and
// tokens per Window and requests in flight, nil for none. A scope is built once per config and shared by
// every request of its subject.
type Scope struct {
	// Subject names it in refusals: `key "rk-ab12"`, `org "acme"`, `key "rk-ab12" for model "llama"`.
	Subject  string
	Requests *Bucket
	Tokens   *Bucket
	InFlight *Gauge
}

// NewScope returns the scope of subject with rpm, tpm and concurrent as limits (0: none), or nil when all
// are 0.
func NewScope(subject string, rpm, tpm, concurrent int64) *Scope {
	if rpm <= 0 && tpm <= 0 && concurrent <= 0 {
		return nil
	}
	s := &Scope{Subject: subject}
	if rpm > 0 {
		s.Requests = NewBucket(rpm)
	}
	if tpm > 0 {
		s.Tokens = NewBucket(tpm)
	}
	if concurrent > 0 {
		s.InFlight = NewGauge(concurrent)
	}
	return s
}

// SetShare makes each of the scope's limits hold its share of one of of gateways keeping them together.
func (s *Scope) SetShare(of int64) {
	if s.Requests != nil {
		s.Requests.SetShare(of)
	}
	if s.Tokens != nil {
		s.Tokens.SetShare(of)
	}
	if s.InFlight != nil {
		s.InFlight.SetShare(of)
	}
}
