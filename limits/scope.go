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
