package overhead

import (
	"fmt"
	"time"
)

// Cases of the overhead report (Case.Name): each is measured on every path, with its own Rolter
// and HAProxy processes in front of the one fake upstream.
const (
	// CaseSmall: Rolter's route is Options.Strategy (round_robin) over one provider, HAProxy's
	// backend one server; every request sends the same ~90-byte chat body. The paced streams run here.
	CaseSmall = "small"
	// CaseCache: a cache_aware route over CacheTargets providers, HAProxy a roundrobin backend of as many
	// servers, all on the same upstream; every user message is PromptBytes long and unique from its first
	// bytes, so Rolter's tries insert every request and, once full, evict (the case users run).
	CaseCache = "cache_aware"
)

// Case is one configuration measured on every path - Rolter's route, HAProxy's backend, the
// request bodies - with its rounds, summary and sustained runs.
type Case struct {
	Name     string `json:"name"`
	Strategy string `json:"strategy"`
	// Targets of Rolter's route (its providers) and servers of HAProxy's backend, all the one upstream.
	Targets int    `json:"targets"`
	Model   string `json:"model"`
	// BodyBytes is the size of a request body; PromptBytes that of its user message when every request's
	// is unique (0: every request sends the same body).
	BodyBytes   int  `json:"body_bytes"`
	PromptBytes int  `json:"prompt_bytes,omitempty"`
	Streams     bool `json:"streams"`
	// BodyNanos is what rendering one body costs the load generator (ns), measured before the rounds.
	BodyNanos float64                 `json:"client_body_ns"`
	Rounds    []map[string]*PathRound `json:"rounds"`
	Summary   map[string]*PathSummary `json:"summary"`
	RSS       []*RSSRun               `json:"rss"`
	// Tries is the cache_aware Rolter's routing memory (nil in other cases).
	Tries *TrieStats `json:"tries,omitempty"`

	// body renders request body number seq into dst (or returns a shared body, which must not be
	// modified); safe for concurrent use.
	body func(dst []byte, seq uint64) []byte
}

// AppendBody appends the body of the case's request number seq to dst.
func (c *Case) AppendBody(dst []byte, seq uint64) []byte { return c.body(dst, seq) }

// Label names the case in goals and headings.
func (c *Case) Label() string {
	if c.PromptBytes > 0 {
		return fmt.Sprintf("%s over %d targets, %s prompts", c.Strategy, c.Targets, byteSize(c.PromptBytes))
	}
	return fmt.Sprintf("%s over %d target, small body", c.Strategy, c.Targets)
}

// byteSize renders n as "8 KiB" when it is a whole number of KiB, else "n B".
func byteSize(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}

var requestBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)

var streamBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Count to 64."}],"max_tokens":64,"stream":true}`)

// firstByteBody asks the fake upstream for a stream of one delta.
var firstByteBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Say ok."}],"max_tokens":1,"stream":true}`)

// Sequence numbers of the bodies: warm-up bodies count from 0, round k's from (k+1)·seqPhase, the
// sustained runs' after the last round's. Every path of a case starts a round at the same number, so
// all paths send the same bodies, and no body is sent twice through one gateway.
const seqPhase = 1_000_000_000

// NewCases returns the report's cases.
func NewCases(o *Options) []*Case {
	small := &Case{Name: CaseSmall, Strategy: o.Strategy, Targets: 1, Model: benchModel, BodyBytes: len(requestBody),
		Streams: true, Summary: map[string]*PathSummary{},
		body: func([]byte, uint64) []byte { return requestBody }}
	g := newPromptBodies(cacheModel, o.PromptBytes)
	cache := &Case{Name: CaseCache, Strategy: "cache_aware", Targets: o.CacheTargets, Model: cacheModel,
		BodyBytes: len(g.appendBody(nil, 0)), PromptBytes: o.PromptBytes, Summary: map[string]*PathSummary{},
		body: g.appendBody}
	return []*Case{small, cache}
}

// bodyNanos returns what rendering one of c's bodies costs, in ns.
func bodyNanos(c *Case) float64 {
	const n = 20000
	buf := c.body(nil, 0)
	start := time.Now()
	for i := uint64(0); i < n; i++ {
		buf = c.body(buf[:0], i)
	}
	sinkBody = buf
	return float64(time.Since(start).Nanoseconds()) / n
}

// sinkBody holds the last rendered body so the compiler cannot drop the timed loop as dead work.
//
//lint:ignore U1000 a benchmark sink is written and never read, by design.
var sinkBody []byte

// unit is one path of one case: what one measurement visits.
type unit struct {
	c    *Case
	path string
}

func (u unit) key() string { return u.c.Name + "/" + u.path }

// gateway is the key of u's gateway process in harness.procs ("" for the direct path).
func (u unit) gateway() string {
	if u.path == PathDirect {
		return ""
	}
	return u.key()
}
