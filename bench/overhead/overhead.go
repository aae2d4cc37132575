package overhead

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/telemetry"
)

// Paths of the overhead report, in the order they are interleaved.
const (
	PathDirect  = "direct"
	PathRolter  = "rolter"
	PathHAProxy = "haproxy"
	// The yardsticks, bench/cmd/refproxy (Options.RefProxy), nothing of a gateway: PathNullFastHTTP
	// is `-mode fasthttp`, fasthttp's server configured as Rolter's and a pooled upstream connection - what
	// the server Rolter is built on reaches before any feature; PathNullNet is `-mode goroutine`, a goroutine
	// per client connection on Go's net package, relaying to an upstream connection of its own - what Go's
	// own serving model reaches; PathNullLean is `-mode lean`, null-fasthttp's relay without fasthttp's
	// server (a goroutine per connection, fasthttp's Request and Response, every read armed before the write
	// it waits on) - what a serving loop of Rolter's own could reach. Measured for latency and throughput
	// only (they frame answers by Content-Length, so no streams), judged by no goal.
	PathNullFastHTTP = "null-fasthttp"
	PathNullNet      = "null-net"
	PathNullLean     = "null-lean"
)

// yardsticks are the refproxy paths and their -mode.
var yardsticks = []struct{ path, mode string }{{PathNullFastHTTP, "fasthttp"}, {PathNullNet, "goroutine"}, {PathNullLean, "lean"}}

func isYardstick(path string) bool {
	return slices.ContainsFunc(yardsticks, func(y struct{ path, mode string }) bool { return y.path == path })
}

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

// Options configure the overhead report. Zero values take the defaults named.
type Options struct {
	// Rolter is the gateway binary (bin/rolter); Upstream the fake upstream binary
	// (go build ./bench/cmd/fakeupstream); HAProxy the haproxy binary (default: looked up in PATH,
	// then /usr/sbin/haproxy). Without HAProxy the report still measures direct and Rolter. RefProxy, when
	// set, is bench/cmd/refproxy's binary, run as the yardsticks (PathNullFastHTTP, PathNullNet).
	Rolter, Upstream, HAProxy, RefProxy string
	// Strategy of the small-body case's route (round_robin).
	Strategy string
	// CacheTargets is the number of targets of the cache_aware case (4) and PromptBytes the size of its
	// user messages (8192).
	CacheTargets, PromptBytes int
	// FillTimeout bounds the cache_aware case's warm-up, which sends unique prompts through Rolter until
	// its tries evict (30s), so that every round measures full tries.
	FillTimeout time.Duration
	// Rounds of interleaved measurements (5).
	Rounds int
	// LatencyRequests per path, case and round at concurrency 1 (2000).
	LatencyRequests int
	// ThroughputConcurrency (64) and ThroughputDuration (3s) per path, case and round, closed loop.
	ThroughputConcurrency int
	ThroughputDuration    time.Duration
	// Streams per path and round on the paced SSE upstream, one at a time, small-body case only (5).
	Streams int
	// FirstByteStreams per path and round, one delta each, one at a time, small-body case only (50): their
	// first bytes make the first-byte figure, which the few long streams would leave to chance.
	FirstByteStreams int
	// SustainDuration of the RSS run per gateway and case at ThroughputConcurrency (20s).
	SustainDuration time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// Test hooks. UpstreamAddr is an upstream already listening (Upstream is then not started), sending
	// streamChunks deltas streamGap apart (64, 20ms); RoutingMemory is the cache_aware Rolter's [server]
	// routing_memory_bytes (0: its default); settle is the wait before the RSS read after a sustained run (2s).
	UpstreamAddr  string
	streamChunks  int
	streamGap     time.Duration
	RoutingMemory int
	settle        time.Duration
}

// DefaultOptions are the report's settings for the fields an Options leaves zero, and the
// command's flag defaults.
func DefaultOptions() Options {
	return Options{
		Strategy: "round_robin", CacheTargets: 4, PromptBytes: 8192, FillTimeout: 30 * time.Second,
		Rounds: 5, LatencyRequests: 2000, ThroughputConcurrency: 64, ThroughputDuration: 3 * time.Second,
		Streams: 5, FirstByteStreams: 50, SustainDuration: 20 * time.Second,
	}
}

func (o *Options) Normalize() error {
	d := DefaultOptions()
	fleet.OrDefault(&o.Strategy, d.Strategy)
	fleet.OrDefault(&o.CacheTargets, d.CacheTargets)
	fleet.OrDefault(&o.PromptBytes, d.PromptBytes)
	fleet.OrDefault(&o.FillTimeout, d.FillTimeout)
	fleet.OrDefault(&o.Rounds, d.Rounds)
	fleet.OrDefault(&o.LatencyRequests, d.LatencyRequests)
	fleet.OrDefault(&o.ThroughputConcurrency, d.ThroughputConcurrency)
	fleet.OrDefault(&o.ThroughputDuration, d.ThroughputDuration)
	fleet.OrDefault(&o.Streams, d.Streams)
	fleet.OrDefault(&o.FirstByteStreams, d.FirstByteStreams)
	fleet.OrDefault(&o.SustainDuration, d.SustainDuration)
	fleet.OrDefault(&o.streamChunks, streamChunks)
	fleet.OrDefault(&o.streamGap, streamGap)
	fleet.OrDefault(&o.settle, 2*time.Second)
	fleet.OrDefault(&o.Log, io.Discard)
	if o.HAProxy == "" {
		o.HAProxy = fleet.LookSbin("haproxy")
	}
	var errs []error
	if o.Rolter == "" {
		errs = append(errs, errors.New("missing the rolter binary (-rolter)"))
	}
	if o.Upstream == "" && o.UpstreamAddr == "" {
		errs = append(errs, errors.New("missing the fake upstream binary (-upstream)"))
	}
	if o.Rounds < 1 || o.LatencyRequests < 10 || o.ThroughputConcurrency < 1 || o.Streams < 1 || o.FirstByteStreams < 1 {
		errs = append(errs, errors.New("rounds, latency requests (>= 10), concurrency and streams must be positive"))
	}
	if o.CacheTargets < 1 || o.CacheTargets > 64 {
		errs = append(errs, fmt.Errorf("cache targets must be between 1 and 64, got %d", o.CacheTargets))
	}
	if o.PromptBytes < promptHeadLen+64 || o.PromptBytes > 1<<20 {
		errs = append(errs, fmt.Errorf("prompt bytes must be between %d and 1048576, got %d", promptHeadLen+64, o.PromptBytes))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot run the overhead report: %w", err)
	}
	return nil
}

// PathRound is one path's measurements in one round of one case. Times in microseconds.
type PathRound struct {
	LatencyP50 float64 `json:"latency_p50_us"`
	LatencyP99 float64 `json:"latency_p99_us"`
	LatencyErr int     `json:"latency_errors"`
	// SparseP50 is the p50 at concurrency 1 of requests sent to the case's paths in turn, one each, so that
	// every process idles between two of its requests (sparse traffic); SparseErr its errors.
	SparseP50  float64 `json:"sparse_latency_p50_us"`
	SparseErr  int     `json:"sparse_latency_errors"`
	Throughput float64 `json:"throughput_rps"`
	TputP99    float64 `json:"throughput_p99_us"`
	TputErr    int     `json:"throughput_errors"`
	// CPU during the throughput run: ClientCPU and MachineCPU are the mean CPUs the load generator and the
	// whole machine kept busy (the machine has Machine.CPUs), OtherCPU what other work took of it: other
	// processes and the hypervisor's steal (machine − interrupt handling − load generator − gateway −
	// upstream); GatewayCPU the gateway process's CPU time per request (µs; 0 on the direct path). -1: not
	// measured (no /proc).
	ClientCPU  float64 `json:"client_cpus"`
	MachineCPU float64 `json:"machine_cpus"`
	OtherCPU   float64 `json:"other_cpus"`
	GatewayCPU float64 `json:"gateway_cpu_us_per_request"`
	// GatewaySwitches are the gateway's context switches (voluntary and not, all its threads) per request
	// during the throughput run: each is a thread that slept and had to be woken, or was preempted. -1: not
	// measured (no /proc).
	GatewaySwitches float64 `json:"gateway_switches_per_request"`
	TTFB            float64 `json:"stream_ttfb_us"` // median over the round's first-byte streams
	StreamErr       int     `json:"stream_errors"`
	// Gaps between consecutive deltas, and each delta's transit time (client receive time minus
	// the upstream's send stamp), pooled over the round's streams.
	Gaps    []float64 `json:"-"`
	Transit []float64 `json:"-"`
	// Jitter is |transit(i) − transit(i−1)| for consecutive deltas: how much the path itself
	// stretches or squeezes a gap, free of the upstream's own pacing jitter.
	Jitter []float64 `json:"-"`
}

// PathSummary is one path over all rounds of a case: medians of the round values, and percentiles of
// the pooled stream gaps and transits. Times in microseconds.
type PathSummary struct {
	Path       string  `json:"path"`
	LatencyP50 float64 `json:"latency_p50_us"`
	LatencyP99 float64 `json:"latency_p99_us"`
	SparseP50  float64 `json:"sparse_latency_p50_us"`
	Throughput float64 `json:"throughput_rps"`
	ClientCPU  float64 `json:"client_cpus"`
	MachineCPU float64 `json:"machine_cpus"`
	OtherCPU   float64 `json:"other_cpus"`
	GatewayCPU float64 `json:"gateway_cpu_us_per_request"`
	// GatewaySwitches: context switches per request (PathRound.GatewaySwitches).
	GatewaySwitches float64 `json:"gateway_switches_per_request"`
	TTFB            float64 `json:"stream_ttfb_us"`
	GapP50          float64 `json:"gap_p50_us"`
	GapP99          float64 `json:"gap_p99_us"`
	TransitP50      float64 `json:"transit_p50_us"`
	TransitP99      float64 `json:"transit_p99_us"`
	JitterP50       float64 `json:"jitter_p50_us"`
	JitterP99       float64 `json:"jitter_p99_us"`
	// GapTop are the largest gaps seen (µs), to tell a tail from a shift.
	GapTop []float64 `json:"gap_top_us"`
	// Gaps and transits pooled over all rounds.
	GapCount int `json:"gaps"`
	Errors   int `json:"errors"`
	// Added* are this path minus direct: medians over rounds of the per-round differences
	// (latency, TTFB), or differences of the pooled percentiles (gaps, transit).
	AddedP50     float64 `json:"added_latency_p50_us"`
	AddedP99     float64 `json:"added_latency_p99_us"`
	AddedSparse  float64 `json:"added_sparse_latency_p50_us"`
	AddedTTFB    float64 `json:"added_ttfb_us"`
	AddedGapP50  float64 `json:"added_gap_p50_us"`
	AddedGapP99  float64 `json:"added_gap_p99_us"`
	AddedTransit float64 `json:"added_transit_p50_us"`
	AddedTrP99   float64 `json:"added_transit_p99_us"`
	AddedJitP50  float64 `json:"added_jitter_p50_us"`
	AddedJitP99  float64 `json:"added_jitter_p99_us"`
}

// RSSRun is the memory of one gateway process around a sustained run.
type RSSRun struct {
	Path string `json:"path"`
	PID  int    `json:"pid"`
	// IdleMiB is right after start, before any request; BeforeMiB just before the sustained run
	// (after the rounds); During are the samples of the run; AfterMiB 2s after it.
	IdleMiB   float64   `json:"idle_mib"`
	BeforeMiB float64   `json:"before_mib"`
	During    []float64 `json:"during_mib"`
	AfterMiB  float64   `json:"after_mib"`
	// MiddleMiB and LastMiB are the medians of the middle and last thirds of During; GrowthMiB
	// their difference. Flat = growth <= max(2 MiB, 5% of the middle third).
	MiddleMiB  float64 `json:"middle_third_mib"`
	LastMiB    float64 `json:"last_third_mib"`
	PeakMiB    float64 `json:"peak_mib"`
	GrowthMiB  float64 `json:"growth_mib"`
	Flat       bool    `json:"flat"`
	Requests   int64   `json:"requests"`
	Throughput float64 `json:"throughput_rps"`
	Errors     int64   `json:"errors"`
}

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

// TrieStats is the cache_aware Rolter's routing memory, from its /metrics: its tries summed over the
// targets after the warm-up and after the rounds.
type TrieStats struct {
	// Filled: the warm-up went on until the tries evicted, which took FillSeconds and FillRequests.
	Filled       bool         `json:"filled"`
	FillSeconds  float64      `json:"fill_seconds"`
	FillRequests int64        `json:"fill_requests"`
	AfterFill    TrieSnapshot `json:"after_fill"`
	AfterRounds  TrieSnapshot `json:"after_rounds"`
}

// TrieSnapshot is one read of a route's trie and decision metrics, summed over its targets.
type TrieSnapshot struct {
	Prompts   float64 `json:"prompts"`
	Nodes     float64 `json:"nodes"`
	EdgeMiB   float64 `json:"edge_mib"`
	ArenaMiB  float64 `json:"arena_mib"`
	Evictions float64 `json:"evictions"`
	// Decisions are rolter_decisions_total by decision (prefix_hit, no_match, ...).
	Decisions map[string]float64 `json:"decisions"`
}

// Report is the whole overhead report.
type Report struct {
	Started  time.Time         `json:"started"`
	Seconds  float64           `json:"seconds"`
	Machine  fleet.Machine     `json:"machine"`
	Options  ReportOptions     `json:"options"`
	Versions map[string]string `json:"versions"`
	Paths    []string          `json:"paths"`
	Cases    []*Case           `json:"cases"`
	Goals    []fleet.Goal      `json:"goals"`
	Notes    []string          `json:"notes,omitempty"`
}

// Case returns the case called name, or nil.
func (rep *Report) Case(name string) *Case {
	for _, c := range rep.Cases {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// ReportOptions is the serialisable part of Options.
type ReportOptions struct {
	Strategy              string `json:"strategy"`
	CacheTargets          int    `json:"cache_targets"`
	PromptBytes           int    `json:"prompt_bytes"`
	FillTimeout           string `json:"fill_timeout"`
	Rounds                int    `json:"rounds"`
	LatencyRequests       int    `json:"latency_requests"`
	ThroughputConcurrency int    `json:"throughput_concurrency"`
	ThroughputDuration    string `json:"throughput_duration"`
	Streams               int    `json:"streams"`
	FirstByteStreams      int    `json:"first_byte_streams"`
	StreamChunks          int    `json:"stream_chunks"`
	StreamGap             string `json:"stream_gap"`
	SustainDuration       string `json:"sustain_duration"`
}

const (
	streamChunks = 64
	streamGap    = 20 * time.Millisecond
	benchModel   = "fake"
	cacheModel   = "fake-cache"
)

var requestBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Say ok."}],"max_tokens":8}`)
var streamBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Count to 64."}],"max_tokens":64,"stream":true}`)

// firstByteBody asks the fake upstream for a stream of one delta.
var firstByteBody = []byte(`{"model":"fake","messages":[{"role":"user","content":"Say ok."}],"max_tokens":1,"stream":true}`)

// Sequence numbers of the bodies: warm-up bodies count from 0, round k's from (k+1)·seqPhase, the
// sustained runs' after the last round's. Every path of a case starts a round at the same number, so
// all paths send the same bodies, and no body is sent twice through one gateway.
const seqPhase = 1_000_000_000

// promptHeadLen is the length of a prompt's "request <12 digits>: " opening.
const promptHeadLen = len("request ") + 12 + len(": ")

// promptSpread is how far apart in the corpus two prompts' text may start.
const promptSpread = 64 << 10

// promptBodies renders the cache_aware case's bodies. Body seq is a chat completion whose one user
// message is size bytes: "request <seq, 12 digits>: ", then corpus text from an offset that depends on
// seq. Two bodies differ within the message's first 20 bytes, so each request is a new ~size-byte branch of
// a Rolter trie (the trie keeps inserting and, once full, evicting), and their text differs
// too, as prompts do. Safe for concurrent use.
type promptBodies struct {
	head, tail []byte
	corpus     []byte // JSON-safe text, size+promptSpread bytes
	size       int
}

func newPromptBodies(model string, size int) *promptBodies {
	words := [...]string{"the", "model", "answers", "a", "question", "about", "routing", "cache", "prefix", "tokens",
		"engine", "gateway", "request", "latency", "of", "and", "with", "every", "prompt", "user", "system",
		"context", "window", "document", "summary", "code", "function", "returns", "value", "table", "row",
		"please", "explain", "why", "this", "works", "under", "load", "on", "two", "cpus", "in", "order"}
	rng := rand.New(rand.NewPCG(19, 8192))
	text := make([]byte, 0, size+promptSpread+16)
	for len(text) < size+promptSpread {
		text = append(text, words[rng.IntN(len(words))]...)
		switch rng.IntN(12) {
		case 0:
			text = append(text, ". "...)
		case 1:
			text = append(text, ", "...)
		default:
			text = append(text, ' ')
		}
	}
	return &promptBodies{
		head:   []byte(`{"model":` + strconv.Quote(model) + `,"messages":[{"role":"user","content":"`),
		tail:   []byte(`"}],"max_tokens":8}`),
		corpus: text[:size+promptSpread],
		size:   size,
	}
}

// appendBody appends body seq to dst and returns the result; it allocates only when dst is too short.
func (g *promptBodies) appendBody(dst []byte, seq uint64) []byte {
	dst = append(dst, g.head...)
	dst = append(dst, "request "...)
	var num [12]byte
	v := seq
	for i := len(num) - 1; i >= 0; i-- {
		num[i] = byte('0' + v%10)
		v /= 10
	}
	dst = append(dst, num[:]...)
	dst = append(dst, ": "...)
	off := int(seq * 4099 % promptSpread) // 4099 is prime: consecutive prompts start far apart
	dst = append(dst, g.corpus[off:off+g.size-promptHeadLen]...)
	return append(dst, g.tail...)
}

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

// gateway is the key of u's gateway process in overheadRun.procs ("" for the direct path).
func (u unit) gateway() string {
	if u.path == PathDirect {
		return ""
	}
	return u.key()
}

// overheadRun holds the processes of a report.
type overheadRun struct {
	o       *Options
	dir     string
	addrs   map[string]string      // unit key -> host:port
	procs   map[string]*fleet.Proc // "upstream", and a unit key for each gateway process
	clients map[string]*fasthttp.HostClient
	chunks  int // deltas per stream the upstream sends
}

// Run measures the fake upstream directly, through `rolter serve` and through HAProxy, for each
// case, in interleaved rounds, then each gateway's RSS around a sustained run. Every process it starts
// is stopped before it returns, also on errors.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Normalize(); err != nil {
		return nil, err
	}
	rep := &Report{
		Started: time.Now(), Machine: fleet.DescribeMachine(), Versions: map[string]string{},
		Options: ReportOptions{
			Strategy: o.Strategy, CacheTargets: o.CacheTargets, PromptBytes: o.PromptBytes, FillTimeout: o.FillTimeout.String(),
			Rounds: o.Rounds, LatencyRequests: o.LatencyRequests,
			ThroughputConcurrency: o.ThroughputConcurrency, ThroughputDuration: o.ThroughputDuration.String(),
			Streams: o.Streams, FirstByteStreams: o.FirstByteStreams, StreamChunks: o.streamChunks, StreamGap: o.streamGap.String(), SustainDuration: o.SustainDuration.String(),
		},
		Cases: NewCases(&o),
	}
	dir, err := os.MkdirTemp("", "rolter-overhead-")
	if err != nil {
		return nil, fmt.Errorf("cannot create a work directory: %w", err)
	}
	defer os.RemoveAll(dir)
	r := &overheadRun{o: &o, dir: dir, addrs: map[string]string{}, procs: map[string]*fleet.Proc{}, clients: map[string]*fasthttp.HostClient{},
		chunks: o.streamChunks}
	defer r.stopAll()
	if err := r.start(ctx, rep); err != nil {
		return nil, err
	}
	idle := map[string]float64{}
	for key, pr := range r.procs {
		if rss, err := fleet.ReadRSS(pr.PID()); err == nil {
			idle[key] = mib(rss)
		}
	}
	for _, c := range rep.Cases {
		if c.PromptBytes > 0 {
			c.BodyNanos = bodyNanos(c)
		}
	}

	fmt.Fprintf(o.Log, "overhead: warming up %v on %d cases\n", rep.Paths, len(rep.Cases))
	var warm atomic.Uint64 // warm-up bodies: sequence numbers from 0
	for _, u := range r.units(rep, 0) {
		if _, err := r.latency(ctx, u, min(300, o.LatencyRequests), &warm); err != nil {
			return nil, err
		}
		r.throughput(ctx, u, o.ThroughputConcurrency, min(500*time.Millisecond, o.ThroughputDuration), &warm)
	}
	if c := rep.Case(CaseCache); c != nil {
		ts, err := r.fill(ctx, unit{c, PathRolter}, &warm)
		if err != nil {
			return nil, err
		}
		c.Tries = ts
		fmt.Fprintf(o.Log, "overhead: %s tries filled in %.1fs (%d requests): %.0f prompts, %.0f evictions\n",
			c.Name, ts.FillSeconds, ts.FillRequests, ts.AfterFill.Prompts, ts.AfterFill.Evictions)
		if !ts.Filled {
			rep.Notes = append(rep.Notes, fmt.Sprintf("the %s case's tries did not evict within the %s warm-up (%d requests): "+
				"the first rounds measured tries that were still growing.", c.Name, o.FillTimeout, ts.FillRequests))
		}
	}

	for round := 0; round < o.Rounds; round++ {
		res := map[string]map[string]*PathRound{}
		seqs := map[string]*atomic.Uint64{}
		for _, c := range rep.Cases {
			res[c.Name] = map[string]*PathRound{}
			for _, p := range rep.Paths {
				res[c.Name][p] = &PathRound{}
				// Every path of a case starts the round at the same number: they all send the same bodies.
				seqs[unit{c, p}.key()] = new(atomic.Uint64)
				seqs[unit{c, p}.key()].Store(uint64(round+1) * seqPhase)
			}
		}
		// Each kind of measurement visits every path of every case before the next kind, and the order of
		// the cases and of the paths rotates every round, so slow drifts of a shared machine hit all alike.
		order := r.units(rep, round)
		for _, u := range order {
			l, err := r.latency(ctx, u, o.LatencyRequests, seqs[u.key()])
			if err != nil {
				return nil, err
			}
			sort.Float64s(l.samples)
			x := res[u.c.Name][u.path]
			x.LatencyP50, x.LatencyP99, x.LatencyErr = loadtest.Percentile(l.samples, 0.5), loadtest.Percentile(l.samples, 0.99), l.errors
		}
		for _, c := range rep.Cases {
			var us []unit
			var useqs []*atomic.Uint64
			for _, u := range order {
				if u.c == c {
					us, useqs = append(us, u), append(useqs, seqs[u.key()])
				}
			}
			sp, err := r.inTurn(ctx, us, useqs, o.LatencyRequests)
			if err != nil {
				return nil, err
			}
			for i, u := range us {
				sort.Float64s(sp[i].samples)
				x := res[c.Name][u.path]
				x.SparseP50, x.SparseErr = loadtest.Percentile(sp[i].samples, 0.5), sp[i].errors
			}
		}
		for _, u := range order {
			t := r.throughput(ctx, u, o.ThroughputConcurrency, o.ThroughputDuration, seqs[u.key()])
			x := res[u.c.Name][u.path]
			x.Throughput, x.TputP99, x.TputErr = t.rps, t.p99, t.errors
			x.ClientCPU, x.MachineCPU, x.OtherCPU, x.GatewayCPU = t.clientCPU, t.machineCPU, t.otherCPU, t.gatewayCPU
			x.GatewaySwitches = t.gatewaySwitches
		}
		for _, u := range order {
			if !u.c.Streams || isYardstick(u.path) {
				continue
			}
			x := res[u.c.Name][u.path]
			var ttfbs []float64
			for s := 0; s < o.FirstByteStreams; s++ {
				st, err := r.stream(ctx, u, firstByteBody, 1)
				if err != nil {
					x.StreamErr++
					fmt.Fprintf(o.Log, "overhead: %s first-byte stream: %s\n", u.key(), err)
					continue
				}
				ttfbs = append(ttfbs, st.ttfb)
			}
			for s := 0; s < o.Streams; s++ {
				st, err := r.stream(ctx, u, streamBody, r.chunks)
				if err != nil {
					x.StreamErr++
					fmt.Fprintf(o.Log, "overhead: %s stream: %s\n", u.key(), err)
					continue
				}
				x.Gaps = append(x.Gaps, st.gaps...)
				x.Transit = append(x.Transit, st.transit...)
				for i := 1; i < len(st.transit); i++ {
					d := st.transit[i] - st.transit[i-1]
					x.Jitter = append(x.Jitter, max(d, -d))
				}
			}
			sort.Float64s(ttfbs)
			x.TTFB = loadtest.Percentile(ttfbs, 0.5)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, c := range rep.Cases {
			c.Rounds = append(c.Rounds, res[c.Name])
			for _, p := range rep.Paths {
				x := res[c.Name][p]
				fmt.Fprintf(o.Log, "overhead: round %d %-11s %-7s c=1 p50 %6.0fµs p99 %6.0fµs | c=%d %7.0f req/s (CPUs: client %.2f, others %.2f, machine %.2f; gateway %.0fµs/req)",
					round+1, c.Name, p, x.LatencyP50, x.LatencyP99, o.ThroughputConcurrency, x.Throughput, x.ClientCPU, x.OtherCPU, x.MachineCPU, x.GatewayCPU)
				if c.Streams {
					fmt.Fprintf(o.Log, " | stream ttfb %6.0fµs", x.TTFB)
				}
				fmt.Fprintln(o.Log)
			}
		}
	}
	for _, c := range rep.Cases {
		summarizeOverhead(c, rep.Paths)
		if c.Tries != nil {
			snap, err := r.trieSnapshot(unit{c, PathRolter})
			if err != nil {
				return nil, err
			}
			c.Tries.AfterRounds = snap
		}
	}
	for _, c := range rep.Cases {
		seq := uint64(o.Rounds+1) * seqPhase
		for _, p := range []string{PathRolter, PathHAProxy} {
			u := unit{c, p}
			pr := r.procs[u.gateway()]
			if pr == nil {
				continue
			}
			fmt.Fprintf(o.Log, "overhead: sustained run through %s for %s (RSS sampled)\n", u.key(), o.SustainDuration)
			var s atomic.Uint64
			s.Store(seq)
			rr, err := r.sustain(ctx, u, pr.PID(), &s)
			if err != nil {
				return nil, err
			}
			rr.IdleMiB = idle[u.gateway()]
			c.RSS = append(c.RSS, rr)
		}
	}
	rep.Goals = goalsOf(rep)
	rep.Seconds = time.Since(rep.Started).Seconds()
	return rep, nil
}

// units returns every path of every case in the order of round: the cases, and the paths within each,
// rotated by round.
func (r *overheadRun) units(rep *Report, round int) []unit {
	var out []unit
	for i := range rep.Cases {
		c := rep.Cases[(i+round)%len(rep.Cases)]
		for _, p := range rotate(rep.Paths, round) {
			out = append(out, unit{c, p})
		}
	}
	return out
}

// fill sends unique prompts through u (the cache_aware case's Rolter) until its tries evict, for at most
// FillTimeout, so that the rounds measure tries that insert and evict as a long-running gateway's do. A
// route without tries is left as it is.
func (r *overheadRun) fill(ctx context.Context, u unit, seq *atomic.Uint64) (*TrieStats, error) {
	ts := &TrieStats{}
	start := time.Now()
	for {
		snap, err := r.trieSnapshot(u)
		if err != nil {
			return nil, err
		}
		ts.AfterFill = snap
		if snap.Evictions > 0 {
			ts.Filled = true
			break
		}
		if snap.Nodes == 0 && snap.ArenaMiB == 0 {
			break // the route keeps no tries (another strategy, bench/cmd/ab -strategy-b): nothing to fill
		}
		left := r.o.FillTimeout - time.Since(start)
		if left <= 0 || ctx.Err() != nil {
			break
		}
		t := r.throughput(ctx, u, r.o.ThroughputConcurrency, min(left, 500*time.Millisecond), seq)
		ts.FillRequests += t.count
	}
	ts.FillSeconds = time.Since(start).Seconds()
	return ts, ctx.Err()
}

// trieSnapshot reads u's Rolter /metrics for the tries and decisions of u's route.
func (r *overheadRun) trieSnapshot(u unit) (TrieSnapshot, error) {
	return readTrieSnapshot(r.addrs[u.key()], u.key(), u.c.Model)
}

// ReadTrieSnapshot reads the trie figures of case c's route from the gateway listening on addr.
func ReadTrieSnapshot(addr string, c *Case) (TrieSnapshot, error) {
	return readTrieSnapshot(addr, unit{c, PathRolter}.key(), c.Model)
}

// readTrieSnapshot reads the trie figures of route from the gateway on addr; name is the gateway's name in errors.
func readTrieSnapshot(addr, name, route string) (TrieSnapshot, error) {
	resp, err := metricsClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: %w", name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: %w", name, err)
	}
	if resp.StatusCode != http.StatusOK {
		return TrieSnapshot{}, fmt.Errorf("cannot read the metrics of %s: status %d: %.200s", name, resp.StatusCode, body)
	}
	return parseTrieMetrics(body, route), nil
}

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// parseTrieMetrics sums the trie gauges and counters of route over its targets, and its decisions.
func parseTrieMetrics(body []byte, route string) TrieSnapshot {
	s := TrieSnapshot{Decisions: map[string]float64{}}
	var sc telemetry.Scanner
	sc.Init(body)
	for sc.Next() {
		x := sc.Sample()
		if l, ok := x.Label("route"); !ok || string(l) != route {
			continue
		}
		switch string(x.Name) {
		case telemetry.TriePrompts:
			s.Prompts += x.Value
		case telemetry.TrieNodes:
			s.Nodes += x.Value
		case telemetry.TrieEdgeBytes:
			s.EdgeMiB += x.Value / (1 << 20)
		case telemetry.TrieArenaBytes:
			s.ArenaMiB += x.Value / (1 << 20)
		case telemetry.TrieEvictions:
			s.Evictions += x.Value
		case "rolter_decisions_total":
			if d, ok := x.Label("decision"); ok {
				s.Decisions[string(d)] += x.Value
			}
		}
	}
	return s
}

// start launches the upstream, then for each case a Rolter and (when found) an HAProxy, and waits
// until each answers.
func (r *overheadRun) start(ctx context.Context, rep *Report) error {
	o := r.o
	upstream := o.UpstreamAddr
	if upstream == "" {
		up, addr, err := fleet.StartProc("fake upstream", o.Upstream, []string{"-listen", "127.0.0.1:0",
			"-chunks", strconv.Itoa(o.streamChunks), "-gap", o.streamGap.String()}, "listening http://", 10*time.Second)
		if err != nil {
			return err
		}
		r.procs["upstream"] = up
		upstream = addr
	}
	rep.Paths = []string{PathDirect, PathRolter}
	if o.HAProxy == "" {
		rep.Notes = append(rep.Notes, "HAProxy not found (make bench-overhead installs the Debian package): no HAProxy column, no ratios.")
	} else {
		rep.Paths = append(rep.Paths, PathHAProxy)
		if out, err := exec.Command(o.HAProxy, "-v").Output(); err == nil {
			rep.Versions["haproxy"] = string(bytes.TrimSpace(bytes.SplitN(out, []byte("\n"), 2)[0]))
		}
	}
	if out, err := exec.Command(o.Rolter, "version").Output(); err == nil {
		rep.Versions["rolter"] = string(bytes.TrimSpace(out))
	}
	if o.RefProxy != "" {
		for _, y := range yardsticks {
			rep.Paths = append(rep.Paths, y.path)
		}
	}
	for _, c := range rep.Cases {
		r.addrs[unit{c, PathDirect}.key()] = upstream

		u := unit{c, PathRolter}
		port, err := fleet.FreePort()
		if err != nil {
			return err
		}
		r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
		routingMemory := 0
		if c.PromptBytes > 0 {
			routingMemory = o.RoutingMemory
		}
		cfgPath := filepath.Join(r.dir, "rolter-"+c.Name+".toml")
		if err := os.WriteFile(cfgPath, []byte(RolterConfig(c, r.addrs[u.key()], upstream, routingMemory)), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", cfgPath, err)
		}
		gw, _, err := fleet.StartProc("rolter ("+c.Name+")", o.Rolter, []string{"serve", "-config", cfgPath, "-log-level", "warn"}, "", 0)
		if err != nil {
			return err
		}
		r.procs[u.gateway()] = gw
		if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/healthz", 15*time.Second, gw); err != nil {
			return fmt.Errorf("rolter (%s) did not come up: %w", c.Name, err)
		}

		for _, y := range yardsticks {
			if o.RefProxy == "" {
				break
			}
			u = unit{c, y.path}
			if port, err = fleet.FreePort(); err != nil {
				return err
			}
			r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
			name := "refproxy -mode " + y.mode + " (" + c.Name + ")"
			np, _, err := fleet.StartProc(name, o.RefProxy, []string{"-mode", y.mode, "-listen", r.addrs[u.key()], "-upstream", upstream}, "", 0)
			if err != nil {
				return err
			}
			r.procs[u.gateway()] = np
			// Its GET /healthz is the upstream's, relayed.
			if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/healthz", 15*time.Second, np); err != nil {
				return fmt.Errorf("%s did not come up: %w", name, err)
			}
		}

		if o.HAProxy == "" {
			continue
		}
		u = unit{c, PathHAProxy}
		if port, err = fleet.FreePort(); err != nil {
			return err
		}
		r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
		hcfg := filepath.Join(r.dir, "haproxy-"+c.Name+".cfg")
		text := haproxyConfig(c, r.addrs[u.key()], upstream, filepath.Join(r.dir, "haproxy-"+c.Name+".pid"))
		if err := os.WriteFile(hcfg, []byte(text), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", hcfg, err)
		}
		// -db keeps it in the foreground: it is our child, stopped by its PID.
		hp, _, err := fleet.StartProc("haproxy ("+c.Name+")", o.HAProxy, []string{"-f", hcfg, "-db"}, "", 0)
		if err != nil {
			return err
		}
		r.procs[u.gateway()] = hp
		if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/health", 15*time.Second, hp); err != nil {
			return fmt.Errorf("haproxy (%s) did not come up: %w", c.Name, err)
		}
	}
	for key, a := range r.addrs {
		r.clients[key] = &fasthttp.HostClient{
			Addr: a, MaxConns: r.o.ThroughputConcurrency + 8, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
			MaxIdleConnDuration: time.Minute,
		}
	}
	return nil
}

// providerNames are the names of c's Rolter providers, one per target.
func providerNames(c *Case) []string {
	if c.Targets == 1 {
		return []string{"upstream"}
	}
	names := make([]string, c.Targets)
	for i := range names {
		names[i] = fmt.Sprintf("upstream-%d", i+1)
	}
	return names
}

// RolterConfig renders the Rolter config of case c: one route over c.Targets providers that all name the
// same upstream, default settings otherwise (routingMemory > 0 sets [server] routing_memory_bytes).
func RolterConfig(c *Case, listen, upstream string, routingMemory int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# overhead report, case %s: one route over %d provider(s), all the fake upstream\n", c.Name, c.Targets)
	fmt.Fprintf(&b, "[server]\nlisten = %q\n", listen)
	if routingMemory > 0 {
		fmt.Fprintf(&b, "routing_memory_bytes = %d\n", routingMemory)
	}
	names := providerNames(c)
	for _, n := range names {
		fmt.Fprintf(&b, "\n[[providers]]\nname = %q\napi_base = \"http://%s\"\n", n, upstream)
	}
	fmt.Fprintf(&b, "\n[[routes]]\nmodel = %q\nstrategy = %q\n", c.Model, c.Strategy)
	for _, n := range names {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = %q\n", n)
	}
	return b.String()
}

// haproxyConfig renders the HAProxy config of case c: a null proxy whose backend has c.Targets servers,
// all the upstream, balanced round robin.
func haproxyConfig(c *Case, listen, upstream, pidfile string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# overhead report, case %s: a null proxy in front of the fake upstream
global
    maxconn 4096
    pidfile %s

defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    http-reuse always
    # Forward each SSE chunk as it comes instead of waiting to merge it with more data (without it
    # the first chunk of a stream waited ~200 ms here): what an operator proxying LLM streams sets.
    option http-no-delay

frontend fe
    bind %s
    default_backend be

backend be
    balance roundrobin
`, c.Name, pidfile, listen)
	for i := 0; i < c.Targets; i++ {
		fmt.Fprintf(&b, "    server s%d %s\n", i+1, upstream)
	}
	return b.String()
}

func (r *overheadRun) stopAll() {
	var keys []string
	for k := range r.procs {
		if k != "upstream" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range append(keys, "upstream") {
		if p := r.procs[k]; p != nil {
			p.Stop()
		}
	}
	for _, c := range r.clients {
		c.CloseIdleConnections()
	}
}

// do sends one non-stream completion over c.
func do(c *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := c.DoTimeout(req, resp, 10*time.Second); err != nil {
		return err
	}
	if resp.StatusCode() != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode(), resp.Body())
	}
	return nil
}

func NewRequest(addr string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + "/v1/chat/completions")
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentType("application/json")
	return req
}

type latencyResult struct {
	samples []float64 // µs
	errors  int
}

// latency sends n requests through u one after another and times each; the bodies are numbered from seq
// on, which it advances. A body is rendered before its request's clock starts.
func (r *overheadRun) latency(ctx context.Context, u unit, n int, seq *atomic.Uint64) (latencyResult, error) {
	res, err := r.inTurn(ctx, []unit{u}, []*atomic.Uint64{seq}, n)
	return res[0], err
}

// inTurn sends n requests at concurrency 1 through each of us, in turn one through each, numbering the
// bodies of us[i] from seqs[i], and returns their latencies per unit. With several units, each gateway idles
// between two of its requests while the others serve theirs, as under sparse traffic, where requests in a
// row through one gateway keep it busy.
func (r *overheadRun) inTurn(ctx context.Context, us []unit, seqs []*atomic.Uint64, n int) ([]latencyResult, error) {
	res := make([]latencyResult, len(us))
	reqs := make([]*fasthttp.Request, len(us))
	for i, u := range us {
		reqs[i] = NewRequest(r.addrs[u.key()])
		defer fasthttp.ReleaseRequest(reqs[i])
		res[i].samples = make([]float64, 0, n)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	bufs := make([][]byte, len(us))
	for k := 0; k < n; k++ {
		if k%256 == 0 && ctx.Err() != nil {
			return res, ctx.Err()
		}
		for i, u := range us {
			bufs[i] = u.c.body(bufs[i][:0], seqs[i].Add(1)-1)
			// The request only reads the buffer, and DoTimeout is done with it when it returns.
			reqs[i].SetBodyRaw(bufs[i])
			start := time.Now()
			err := do(r.clients[u.key()], reqs[i], resp)
			d := time.Since(start)
			if err != nil {
				res[i].errors++
				if res[i].errors > n/10 {
					return res, fmt.Errorf("%s: too many errors at concurrency 1: %w", u.key(), err)
				}
				continue
			}
			res[i].samples = append(res[i].samples, float64(d)/float64(time.Microsecond))
		}
	}
	return res, nil
}

type throughputResult struct {
	rps    float64
	p99    float64 // µs
	errors int
	count  int64
	// clientCPU, machineCPU and otherCPU: mean CPUs this process, the machine and the processes outside
	// the report kept busy; gatewayCPU: the gateway process's CPU µs per request (0 on the direct path).
	// gatewaySwitches: the gateway's context switches per request (0 on the direct path). -1: unknown.
	clientCPU, machineCPU, otherCPU, gatewayCPU, gatewaySwitches float64
}

// throughput runs a closed loop of conc requests in flight through u for d; the bodies are numbered from
// seq on, which it advances.
func (r *overheadRun) throughput(ctx context.Context, u unit, conc int, d time.Duration, seq *atomic.Uint64) throughputResult {
	c := r.clients[u.key()]
	var ok, failed atomic.Int64
	lat := make([][]float64, conc)
	gwPID := 0
	if p := r.procs[u.gateway()]; p != nil {
		gwPID = p.PID()
	}
	upPID := 0
	if p := r.procs["upstream"]; p != nil {
		upPID = p.PID()
	}
	busy0, okBusy := fleet.MachineBusy()
	irq0, okIRQ := interruptCPU()
	self0, okSelf := fleet.SelfCPU()
	gw0, okGW := procCPU(gwPID)
	up0, okUp := procCPU(upPID)
	sw0, okSw := procSwitches(gwPID)
	deadline := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := NewRequest(r.addrs[u.key()])
			defer fasthttp.ReleaseRequest(req)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			var buf []byte
			for time.Now().Before(deadline) && ctx.Err() == nil {
				buf = u.c.body(buf[:0], seq.Add(1)-1)
				req.SetBodyRaw(buf)
				t := time.Now()
				if err := do(c, req, resp); err != nil {
					failed.Add(1)
					continue
				}
				ok.Add(1)
				if len(lat[w]) < 100000 {
					lat[w] = append(lat[w], float64(time.Since(t))/float64(time.Microsecond))
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	busy1, okBusy1 := fleet.MachineBusy()
	irq1, okIRQ1 := interruptCPU()
	self1, okSelf1 := fleet.SelfCPU()
	gw1, okGW1 := procCPU(gwPID)
	up1, okUp1 := procCPU(upPID)
	sw1, okSw1 := procSwitches(gwPID)
	var all []float64
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Float64s(all)
	res := throughputResult{rps: float64(ok.Load()) / elapsed.Seconds(), p99: loadtest.Percentile(all, 0.99), errors: int(failed.Load()),
		count: ok.Load(), clientCPU: -1, machineCPU: -1, otherCPU: -1, gatewayCPU: -1, gatewaySwitches: -1}
	if okBusy && okBusy1 {
		res.machineCPU = (busy1 - busy0) / elapsed.Seconds()
	}
	if okSelf && okSelf1 {
		res.clientCPU = (self1 - self0) / elapsed.Seconds()
	}
	gwOK := gwPID == 0 || okGW && okGW1
	switch {
	case gwPID == 0:
		res.gatewayCPU = 0
	case gwOK && res.count > 0:
		res.gatewayCPU = (gw1 - gw0) * 1e6 / float64(res.count)
	}
	switch {
	case gwPID == 0:
		res.gatewaySwitches = 0
	case okSw && okSw1 && res.count > 0:
		res.gatewaySwitches = float64(sw1-sw0) / float64(res.count)
	}
	// Without an upstream process (tests) its CPU is this process's.
	upOK := upPID == 0 || okUp && okUp1
	if res.machineCPU >= 0 && res.clientCPU >= 0 && gwOK && upOK && okIRQ && okIRQ1 {
		res.otherCPU = max(0, res.machineCPU-res.clientCPU-((irq1-irq0)+(gw1-gw0)+(up1-up0))/elapsed.Seconds())
	}
	return res
}

// interruptCPU returns the machine's irq + softirq CPU seconds from /proc/stat: loopback TCP is
// handled there, for the report's processes, without being charged to them.
func interruptCPU() (float64, bool) { return fleet.StatCPU(6, 7) }

// procSwitches returns the context switches of every thread of process pid so far, voluntary (the thread
// slept: a wait, a lock, a blocking call) and not (it was preempted), from /proc/PID/task/*/status.
func procSwitches(pid int) (int64, bool) {
	if pid <= 0 {
		return 0, false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue // the thread exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			// voluntary_ctxt_switches and nonvoluntary_ctxt_switches
			if _, v, ok := strings.Cut(line, "ctxt_switches:"); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n, true
}

// procCPU returns the user + system CPU seconds of process pid.
func procCPU(pid int) (float64, bool) {
	if pid <= 0 {
		return 0, false
	}
	return fleet.ProcessCPU("/proc/" + strconv.Itoa(pid) + "/stat")
}

type streamResult struct {
	ttfb    float64   // µs to the first body byte
	gaps    []float64 // µs between consecutive deltas
	transit []float64 // µs from the upstream's send stamp to the client's read
}

// stream reads one paced SSE answer to body, of chunks deltas, through u and times its events as they arrive.
func (r *overheadRun) stream(ctx context.Context, u unit, body []byte, chunks int) (streamResult, error) {
	var res streamResult
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.addrs[u.key()]+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return res, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := streamClient.Do(req)
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return res, fmt.Errorf("status %d", resp.StatusCode)
	}
	var pending []byte
	buf := make([]byte, 32<<10)
	var last time.Time
	deltas := 0
	done := false
	for !done {
		n, err := resp.Body.Read(buf)
		now := time.Now()
		if n > 0 {
			if res.ttfb == 0 {
				res.ttfb = float64(now.Sub(start)) / float64(time.Microsecond)
			}
			pending = append(pending, buf[:n]...)
			for {
				i := bytes.Index(pending, []byte("\n\n"))
				if i < 0 {
					break
				}
				ev := pending[:i]
				pending = pending[i+2:]
				if bytes.Equal(ev, []byte("data: [DONE]")) {
					done = true
					break
				}
				stamp, ok := deltaStamp(ev)
				if !ok {
					continue // the role and finish chunks
				}
				deltas++
				res.transit = append(res.transit, float64(now.UnixNano()-stamp)/1e3)
				if !last.IsZero() {
					res.gaps = append(res.gaps, float64(now.Sub(last))/float64(time.Microsecond))
				}
				last = now
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) && done {
				break
			}
			if !done {
				return res, fmt.Errorf("stream ended after %d deltas: %w", deltas, err)
			}
			break
		}
	}
	if deltas != chunks {
		return res, fmt.Errorf("got %d deltas, want %d", deltas, chunks)
	}
	// Read on past [DONE] to the end of the body, as the OpenAI SDKs do ("ensure the entire stream is
	// consumed"), so that the connection goes back to the client's pool: a body closed unread closes its
	// connection, and every stream would then pay a new connection to the path.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return res, fmt.Errorf("after [DONE]: %w", err)
	}
	return res, nil
}

var streamClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}, Timeout: time.Minute}

// deltaStamp returns the send time a delta event carries as its content.
func deltaStamp(ev []byte) (int64, bool) {
	i := bytes.Index(ev, []byte(`"content":"`))
	if i < 0 {
		return 0, false
	}
	rest := ev[i+len(`"content":"`):]
	j := bytes.IndexByte(rest, '"')
	if j <= 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	return v, err == nil
}

// sustain runs a closed loop through u for SustainDuration while sampling the gateway's RSS; the bodies
// are numbered from seq on.
func (r *overheadRun) sustain(ctx context.Context, u unit, pid int, seq *atomic.Uint64) (*RSSRun, error) {
	rr := &RSSRun{Path: u.path, PID: pid}
	before, err := fleet.ReadRSS(pid)
	if err != nil {
		return nil, err
	}
	rr.BeforeMiB = mib(before)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if v, err := fleet.ReadRSS(pid); err == nil {
					rr.During = append(rr.During, mib(v))
				}
			}
		}
	}()
	t := r.throughput(ctx, u, r.o.ThroughputConcurrency, r.o.SustainDuration, seq)
	close(stop)
	<-sampled
	rr.Requests, rr.Throughput, rr.Errors = t.count, t.rps, int64(t.errors)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(r.o.settle):
	}
	after, err := fleet.ReadRSS(pid)
	if err != nil {
		return nil, err
	}
	rr.AfterMiB = mib(after)
	rr.MiddleMiB, rr.LastMiB, rr.PeakMiB, rr.GrowthMiB, rr.Flat = rssTrend(rr.During)
	return rr, nil
}

// rssTrend reduces RSS samples of a sustained run: medians of the middle and last thirds (the
// first third is warm-up), the peak, the growth between the two thirds, and whether that growth
// is within max(2 MiB, 5% of the middle third).
func rssTrend(samples []float64) (middle, last, peak, growth float64, flat bool) {
	n := len(samples)
	if n < 3 {
		return 0, 0, 0, 0, false
	}
	med := func(v []float64) float64 {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return loadtest.Percentile(s, 0.5)
	}
	middle, last = med(samples[n/3:2*n/3]), med(samples[2*n/3:])
	for _, v := range samples {
		peak = max(peak, v)
	}
	growth = last - middle
	return middle, last, peak, growth, growth <= max(2, 0.05*middle)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func rotate(s []string, k int) []string {
	out := make([]string, len(s))
	for i := range s {
		out[i] = s[(i+k)%len(s)]
	}
	return out
}

// summarizeOverhead fills c.Summary from its rounds.
func summarizeOverhead(c *Case, paths []string) {
	median := func(f func(*PathRound) float64, path string) float64 {
		var v []float64
		for _, r := range c.Rounds {
			if x := r[path]; x != nil {
				v = append(v, f(x))
			}
		}
		sort.Float64s(v)
		return loadtest.Percentile(v, 0.5)
	}
	addedMedian := func(f func(*PathRound) float64, path string) float64 {
		var v []float64
		for _, r := range c.Rounds {
			if x, d := r[path], r[PathDirect]; x != nil && d != nil {
				v = append(v, f(x)-f(d))
			}
		}
		sort.Float64s(v)
		return loadtest.Percentile(v, 0.5)
	}
	pooled := func(f func(*PathRound) []float64, path string, q float64) float64 {
		var v []float64
		for _, r := range c.Rounds {
			if x := r[path]; x != nil {
				v = append(v, f(x)...)
			}
		}
		sort.Float64s(v)
		return loadtest.Percentile(v, q)
	}
	gaps := func(x *PathRound) []float64 { return x.Gaps }
	transit := func(x *PathRound) []float64 { return x.Transit }
	jitter := func(x *PathRound) []float64 { return x.Jitter }
	if c.Summary == nil {
		c.Summary = map[string]*PathSummary{}
	}
	for _, p := range paths {
		s := &PathSummary{Path: p}
		s.LatencyP50 = median(func(x *PathRound) float64 { return x.LatencyP50 }, p)
		s.LatencyP99 = median(func(x *PathRound) float64 { return x.LatencyP99 }, p)
		s.SparseP50 = median(func(x *PathRound) float64 { return x.SparseP50 }, p)
		s.Throughput = median(func(x *PathRound) float64 { return x.Throughput }, p)
		s.ClientCPU = median(func(x *PathRound) float64 { return x.ClientCPU }, p)
		s.MachineCPU = median(func(x *PathRound) float64 { return x.MachineCPU }, p)
		s.OtherCPU = median(func(x *PathRound) float64 { return x.OtherCPU }, p)
		s.GatewayCPU = median(func(x *PathRound) float64 { return x.GatewayCPU }, p)
		s.GatewaySwitches = median(func(x *PathRound) float64 { return x.GatewaySwitches }, p)
		s.TTFB = median(func(x *PathRound) float64 { return x.TTFB }, p)
		s.GapP50, s.GapP99 = pooled(gaps, p, 0.5), pooled(gaps, p, 0.99)
		s.TransitP50, s.TransitP99 = pooled(transit, p, 0.5), pooled(transit, p, 0.99)
		s.JitterP50, s.JitterP99 = pooled(jitter, p, 0.5), pooled(jitter, p, 0.99)
		var all []float64
		for _, r := range c.Rounds {
			if x := r[p]; x != nil {
				all = append(all, x.Gaps...)
			}
		}
		sort.Sort(sort.Reverse(sort.Float64Slice(all)))
		s.GapCount = len(all)
		s.GapTop = append([]float64(nil), all[:min(5, len(all))]...)
		for _, r := range c.Rounds {
			if x := r[p]; x != nil {
				s.Errors += x.LatencyErr + x.SparseErr + x.TputErr + x.StreamErr
			}
		}
		c.Summary[p] = s
	}
	d := c.Summary[PathDirect]
	for _, p := range paths {
		s := c.Summary[p]
		if p == PathDirect || d == nil {
			continue
		}
		s.AddedP50 = addedMedian(func(x *PathRound) float64 { return x.LatencyP50 }, p)
		s.AddedP99 = addedMedian(func(x *PathRound) float64 { return x.LatencyP99 }, p)
		s.AddedSparse = addedMedian(func(x *PathRound) float64 { return x.SparseP50 }, p)
		s.AddedTTFB = addedMedian(func(x *PathRound) float64 { return x.TTFB }, p)
		s.AddedGapP50, s.AddedGapP99 = s.GapP50-d.GapP50, s.GapP99-d.GapP99
		s.AddedTransit, s.AddedTrP99 = s.TransitP50-d.TransitP50, s.TransitP99-d.TransitP99
		s.AddedJitP50, s.AddedJitP99 = s.JitterP50-d.JitterP50, s.JitterP99-d.JitterP99
	}
}

// goalsOf evaluates the gateway overhead goals: per case, added c=1 latency p50 and c=64
// throughput against HAProxy's (and the p99 in the small-body case); in the streaming case, the added time to
// the first byte against HAProxy's and the stream gap; RSS flat per case.
func goalsOf(rep *Report) []fleet.Goal {
	var goals []fleet.Goal
	for _, c := range rep.Cases {
		ro, hp := c.Summary[PathRolter], c.Summary[PathHAProxy]
		if ro == nil {
			continue
		}
		ratioGoal := func(name, target string, limit float64, rv, hv float64, unit string, lowerIsBetter bool) {
			name = c.Label() + ": " + name
			if hp == nil {
				goals = append(goals, fleet.Goal{Name: name, Target: target, Measured: fmt.Sprintf("Rolter %.0f %s; HAProxy not measured", rv, unit), Verdict: "n/a"})
				return
			}
			if hv <= 0 {
				goals = append(goals, fleet.Goal{Name: name, Target: target,
					Measured: fmt.Sprintf("Rolter %.0f %s, HAProxy %.0f %s: HAProxy's is not above the noise, no ratio", rv, unit, hv, unit),
					Verdict:  fleet.Verdict(rv <= 0)})
				return
			}
			ratio := rv / hv
			ok := ratio <= limit
			if !lowerIsBetter {
				ok = ratio >= limit
			}
			goals = append(goals, fleet.Goal{Name: name, Target: target,
				Measured: fmt.Sprintf("%.2fx (Rolter %.0f %s, HAProxy %.0f %s)", ratio, rv, unit, hv, unit), Verdict: fleet.Verdict(ok)})
		}
		var hAddedP50, hAddedP99, hTput float64
		if hp != nil {
			hAddedP50, hAddedP99, hTput = hp.AddedP50, hp.AddedP99, hp.Throughput
		}
		ratioGoal("added latency at concurrency 1, p50 (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedP50, hAddedP50, "µs", true)
		if c.Name == CaseSmall {
			ratioGoal("added latency at concurrency 1, p99 (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedP99, hAddedP99, "µs", true)
		}
		ratioGoal(fmt.Sprintf("throughput at concurrency %d (Rolter ÷ HAProxy)", rep.Options.ThroughputConcurrency), ">= 0.8x", 0.8,
			ro.Throughput, hTput, "req/s", false)
		if c.Streams {
			var hAddedTTFB float64
			if hp != nil {
				hAddedTTFB = hp.AddedTTFB
			}
			ratioGoal("added stream time to first byte (Rolter ÷ HAProxy)", "<= 1.2x", 1.2, ro.AddedTTFB, hAddedTTFB, "µs", true)
		}
	}
	for _, c := range rep.Cases {
		ro, d := c.Summary[PathRolter], c.Summary[PathDirect]
		if !c.Streams || ro == nil || d == nil {
			continue
		}
		// The verdict uses the send-stamped measure: the raw gap percentiles also carry the
		// upstream's own timer jitter, which differs between streams and, on a shared machine,
		// swamps a 50 µs goal either way (both are shown).
		goals = append(goals, fleet.Goal{Name: c.Label() + ": added inter-chunk gap p99 (Rolter − direct, send-stamped)", Target: "< 50 µs",
			Measured: fmt.Sprintf("%+.1f µs (gap change p99 %.0f µs vs %.0f µs direct; raw gap p99 %+.0f µs: %.0f vs %.0f)",
				ro.AddedJitP99, ro.JitterP99, d.JitterP99, ro.AddedGapP99, ro.GapP99, d.GapP99),
			Verdict: fleet.Verdict(ro.AddedJitP99 < 50)})
	}
	for _, c := range rep.Cases {
		for _, rr := range c.RSS {
			if rr.Path != PathRolter {
				continue
			}
			goals = append(goals, fleet.Goal{Name: c.Label() + ": Rolter RSS flat across the sustained run", Target: "growth <= max(2 MiB, 5%)",
				Measured: fmt.Sprintf("%+.1f MiB (middle third %.1f, last third %.1f, peak %.1f, after %.1f MiB)",
					rr.GrowthMiB, rr.MiddleMiB, rr.LastMiB, rr.PeakMiB, rr.AfterMiB),
				Verdict: fleet.Verdict(rr.Flat)})
		}
	}
	return goals
}
