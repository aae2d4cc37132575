package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// Bounds of a run: every run ends by count and by time.
const (
	defaultDuration    = 2 * time.Minute
	maxDuration        = time.Hour
	defaultTimeout     = time.Minute
	defaultConcurrency = 8
	maxConcurrency     = 4096
	defaultModel       = "sim-model"
)

// Options configure one load-test run.
type Options struct {
	// URL is the base URL of the gateway (or of one engine): requests go to
	// URL + "/v1/chat/completions". It must be loopback unless AllowRemote.
	URL string
	// Model is the model name sent; default "sim-model".
	Model string
	// APIKey, when set, is sent as "Authorization: Bearer <APIKey>".
	APIKey string
	// Workload is what to send (see Workload).
	Workload Workload
	// Plan, when set, is sent instead of Workload's generated plan: an explicit list of requests
	// (a replayed trace), in order, each with its own max_tokens (else Plan.Workload's
	// OutputTokens), x-session-id and dependency on an earlier request, and, when Plan.Timed,
	// its send time (open loop; Rate is then ignored). Plan.Workload describes it in the Result.
	// The plan is not modified.
	Plan *Plan
	// Rate > 0 runs open loop at Rate requests per second (vegeta keeps the rate by starting
	// workers, up to Concurrency of them); 0 runs closed loop with Concurrency requests in flight.
	// In multi-turn, a tick waits for a user whose previous answer is in, so Rate is an upper bound.
	Rate float64
	// Concurrency is the closed-loop in-flight count, or the open-loop cap on workers (default 8;
	// at most 4096).
	Concurrency int
	// MaxRequests stops the run after that many requests (default and maximum: the plan's size).
	MaxRequests int
	// Duration bounds the whole run: no request is started after it, and requests still in flight
	// then are cancelled and counted as Cancelled (default 2m, at most 1h).
	Duration time.Duration
	// Timeout bounds one request, body included (default 1m).
	Timeout time.Duration
	// NonStream sends "stream": false. By default requests stream with
	// stream_options.include_usage, so the time to the first body byte is the time to the first
	// token and usage arrives in the last event.
	NonStream bool
	// TokenIDs sends x-rolter-vllm-token-ids (for precise_cache_aware), fetched from
	// TokenizeURL + "/tokenize" and cached per prompt. Tokenizing happens before the request's
	// clock starts.
	TokenIDs bool
	// TokenizeURL is the engine whose /tokenize gives the ids; default URL.
	TokenizeURL string
	// Targets, when set, are the x-rolter-target names expected; a target that got no request
	// then counts in the share (its share is 0 and max/min is unbounded).
	Targets []string
	// BlockSize is the KV block size the oracle uses; default 16 (vLLM's and the sim's).
	BlockSize int
	// OracleCapacity, when > 0, adds the capacity-aware oracle to the Result: one pooled LRU
	// prefix cache of that many blocks (CapacityOracle).
	OracleCapacity int
	// AllowRemote permits non-loopback URLs.
	AllowRemote bool
	// KeepSamples keeps one Sample per request in Result.Samples.
	KeepSamples bool
}

// Sample is one request as measured.
type Sample struct {
	Index        int     `json:"index"`
	Group        int     `json:"group"` // shared-prefix group or multi-turn user; -1 otherwise
	Round        int     `json:"round"`
	Session      string  `json:"session,omitempty"` // x-session-id sent, explicit plans only
	Status       int     `json:"status"`
	Error        string  `json:"error,omitempty"`
	Target       string  `json:"target,omitempty"`
	Decision     string  `json:"decision,omitempty"`
	PrefixMatch  float64 `json:"prefix_match"` // the gateway's x-rolter-prefix-match, -1 when absent
	StartMs      float64 `json:"start_ms"`     // since the run's first request
	TTFTMs       float64 `json:"ttft_ms"`
	LatencyMs    float64 `json:"latency_ms"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	OutputTokens int     `json:"output_tokens"`
	// Prompt is the messages sent (shared with the plan; not written as JSON).
	Prompt     []Message `json:"-"`
	cancelled  bool
	start, end time.Time
}

// sent is one request built by the targeter.
type sent struct {
	group, round int
	user         *userState // multi-turn only
	msgs         []Message  // the prompt (kept for the oracle)
	index        int        // static plans: the plan index
	session      string     // explicit plans: x-session-id
}

// userState is a multi-turn conversation in progress. It is handed between the targeter and the
// result loop through the ready channel, so only one goroutine touches it at a time.
type userState struct {
	conv    *Conversation
	history []Message
	round   int
}

// run is one Run in progress.
type run struct {
	opts     Options
	plan     *Plan
	limit    int
	endpoint string
	tok      *tokenizer
	timing   *TimingTransport

	next  atomic.Int64 // static scenarios: next plan index
	turns *turns       // explicit plans whose requests wait on earlier ones (next unused); else nil

	mu   sync.Mutex
	sent []*sent

	ready    chan *userState // multi-turn: users whose next round can go
	done     chan struct{}   // multi-turn: closed when every user finished
	finished int             // multi-turn users finished (result loop only)
}

// Run generates the workload, sends it with vegeta, and measures it. It returns an error only
// when the run cannot start (bad options, refused URL, tokenize failure); failed requests are
// counted in the Result.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	plan := opts.Plan
	if plan != nil {
		opts.Workload = plan.Workload
	} else {
		var err error
		if plan, err = opts.Workload.Generate(); err != nil {
			return nil, err
		}
	}
	r := &run{
		opts:     opts,
		plan:     plan,
		limit:    plan.Size(),
		endpoint: strings.TrimRight(opts.URL, "/") + "/v1/chat/completions",
	}
	if opts.MaxRequests > 0 && opts.MaxRequests < r.limit {
		r.limit = opts.MaxRequests
	}
	if opts.Plan != nil {
		r.turns = newTurns(plan, r.limit)
	}

	ctx, cancel := context.WithTimeout(ctx, opts.Duration)
	defer cancel()
	transport := &http.Transport{
		MaxIdleConnsPerHost: opts.Concurrency + 16,
		DisableCompression:  true,
		IdleConnTimeout:     30 * time.Second,
	}
	defer transport.CloseIdleConnections()
	r.timing = &TimingTransport{Base: transport, Context: ctx}
	client := &http.Client{Transport: r.timing, Timeout: opts.Timeout}
	if opts.TokenIDs {
		r.tok = newTokenizer(opts.TokenizeURL, opts.Model, &http.Client{Transport: transport, Timeout: opts.Timeout})
		if err := r.pretokenize(ctx); err != nil {
			return nil, err
		}
	}
	if plan.Conversations != nil {
		r.ready = make(chan *userState, len(plan.Conversations))
		r.done = make(chan struct{})
		for i := range plan.Conversations {
			c := &plan.Conversations[i]
			r.ready <- &userState{conv: c, history: append([]Message(nil), c.Prefix...)}
		}
	}

	workers, maxWorkers := uint64(opts.Concurrency), uint64(opts.Concurrency)
	var pacer vegeta.Pacer
	switch {
	case plan.Timed:
		at := make([]time.Duration, r.limit)
		for i := range at {
			at[i] = plan.Requests[i].At
		}
		pacer = &schedulePacer{at: at}
		workers = min(workers, 16)
	case opts.Rate > 0:
		pacer = &countPacer{limit: uint64(r.limit), interval: time.Duration(float64(time.Second) / opts.Rate)}
		workers = min(workers, 16)
	default:
		pacer = &countPacer{limit: uint64(r.limit)}
	}
	atk := vegeta.NewAttacker(
		vegeta.Client(client),
		vegeta.Workers(workers),
		vegeta.MaxWorkers(maxWorkers),
		vegeta.MaxBody(-1),
	)
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			atk.Stop()
		case <-stopped:
		}
	}()

	var samples []Sample
	for res := range atk.Attack(r.targeter(ctx), pacer, opts.Duration, "") {
		if res.Method == "" {
			continue // the targeter had nothing (more) to send: not a request
		}
		tm, ok := r.timing.Take(res.Seq)
		if !ok || tm.Index < 0 {
			continue
		}
		s := r.measure(ctx, res, tm)
		samples = append(samples, s)
	}
	return r.result(samples), nil
}

func (o *Options) normalize() error {
	var errs []error
	if o.URL == "" {
		errs = append(errs, errors.New("missing URL"))
	} else if !o.AllowRemote {
		if err := CheckLoopback(o.URL); err != nil {
			errs = append(errs, err)
		}
	}
	if o.TokenizeURL == "" {
		o.TokenizeURL = o.URL
	} else if !o.AllowRemote {
		if err := CheckLoopback(o.TokenizeURL); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Model == "" {
		o.Model = defaultModel
	}
	if o.Concurrency == 0 {
		o.Concurrency = defaultConcurrency
	}
	if o.Concurrency < 1 || o.Concurrency > maxConcurrency {
		errs = append(errs, fmt.Errorf("concurrency must be between 1 and %d, got %d", maxConcurrency, o.Concurrency))
	}
	if !(o.Rate >= 0) || o.Rate > 1e6 {
		errs = append(errs, fmt.Errorf("rate must be between 0 and 1e6, got %v", o.Rate))
	}
	if o.MaxRequests < 0 {
		errs = append(errs, fmt.Errorf("max requests must not be negative, got %d", o.MaxRequests))
	}
	if o.Duration == 0 {
		o.Duration = defaultDuration
	}
	if o.Duration < 0 || o.Duration > maxDuration {
		errs = append(errs, fmt.Errorf("duration must be between 0 and %s, got %s", maxDuration, o.Duration))
	}
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout must not be negative, got %s", o.Timeout))
	}
	if o.BlockSize == 0 {
		o.BlockSize = 16
	}
	if o.BlockSize < 0 {
		errs = append(errs, fmt.Errorf("block size must be positive, got %d", o.BlockSize))
	}
	if o.OracleCapacity < 0 {
		errs = append(errs, fmt.Errorf("oracle capacity must not be negative, got %d", o.OracleCapacity))
	}
	if o.Plan != nil {
		if err := o.Plan.checkExplicit(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot run load test: %w", err)
	}
	return nil
}

// pretokenize fetches the token ids of the static prompts before the clock starts (4 at a time).
func (r *run) pretokenize(ctx context.Context) error {
	if r.plan.Requests == nil {
		return nil
	}
	idx := make(chan int)
	errc := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				if _, err := r.tok.header(ctx, r.plan.Requests[i].Messages); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := 0; i < r.limit; i++ {
		select {
		case idx <- i:
		case err = <-errc:
			break feed
		}
	}
	close(idx)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

type chatBody struct {
	Model         string         `json:"model"`
	Messages      []Message      `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// targeter returns the vegeta.Targeter of the run. It is called from many workers at once.
func (r *run) targeter(ctx context.Context) vegeta.Targeter {
	return func(t *vegeta.Target) error {
		// No request starts after Duration: a worker whose request the deadline cancelled asks for another
		// before the attack sees the end.
		if err := ctx.Err(); err != nil {
			return err
		}
		var s *sent
		if r.plan.Conversations == nil {
			var i int
			if r.turns != nil {
				var err error
				if i, err = r.turns.take(ctx.Done()); err != nil {
					if err != vegeta.ErrNoTargets {
						r.turns.fail()
					}
					return err
				}
			} else if i = int(r.next.Add(1) - 1); i >= r.limit {
				return vegeta.ErrNoTargets
			}
			req := &r.plan.Requests[i]
			s = &sent{group: req.Group, msgs: req.Messages, index: i, session: req.Session}
		} else {
			select {
			case u := <-r.ready:
				u.history = append(u.history, Message{Role: "user", Content: u.conv.Questions[u.round]})
				s = &sent{group: u.conv.User, round: u.round, user: u, msgs: append([]Message(nil), u.history...)}
			case <-r.done:
				return vegeta.ErrNoTargets
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		body := chatBody{Model: r.opts.Model, Messages: s.msgs, MaxTokens: r.plan.Workload.OutputTokens, Stream: !r.opts.NonStream}
		if s.user == nil && r.plan.Requests[s.index].MaxTokens > 0 {
			body.MaxTokens = r.plan.Requests[s.index].MaxTokens
		}
		if s.user == nil && r.plan.Requests[s.index].Model != "" {
			body.Model = r.plan.Requests[s.index].Model
		}
		if body.Stream {
			body.StreamOptions = &streamOptions{IncludeUsage: true}
		}
		data, err := json.Marshal(body)
		if err != nil {
			r.giveUp(s)
			return fmt.Errorf("cannot encode request: %w", err)
		}
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		if r.opts.APIKey != "" {
			h.Set("Authorization", "Bearer "+r.opts.APIKey)
		}
		if s.session != "" {
			h.Set(SessionHeader, s.session)
		}
		if r.tok != nil {
			ids, err := r.tok.header(ctx, s.msgs)
			if err != nil {
				r.giveUp(s)
				return err
			}
			h.Set(TokenIDsHeader, ids)
		}
		r.mu.Lock()
		index := len(r.sent)
		r.sent = append(r.sent, s)
		r.mu.Unlock()
		h.Set(IndexHeader, strconv.Itoa(index))
		*t = vegeta.Target{Method: http.MethodPost, URL: r.endpoint, Body: data, Header: h}
		return nil
	}
}

// measure turns one vegeta result into a Sample and, in multi-turn, queues the user's next round.
func (r *run) measure(ctx context.Context, res *vegeta.Result, tm *Timing) Sample {
	r.mu.Lock()
	s := r.sent[tm.Index]
	r.mu.Unlock()
	smp := Sample{Index: tm.Index, Group: s.group, Round: s.round, Session: s.session, Status: int(res.Code), Prompt: s.msgs,
		start: tm.Start, end: tm.End}
	if smp.end.IsZero() {
		smp.end = tm.Start.Add(res.Latency)
	}
	smp.TTFTMs = ms(tm.TTFB())
	smp.LatencyMs = ms(smp.end.Sub(smp.start))
	rt := ParseRouting(res.Headers)
	smp.Target, smp.Decision, smp.PrefixMatch = rt.Target, rt.Decision, rt.PrefixMatch
	var reply Reply
	var err error
	switch {
	case res.Error != "" && res.Code == 0:
		err = errors.New(res.Error)
	case res.Code != http.StatusOK:
		err = fmt.Errorf("status %d: %s", res.Code, errorMessage(res.Body))
	case r.opts.NonStream:
		reply, err = ParseJSON(res.Body)
	default:
		reply, err = ParseStream(res.Body)
	}
	if err == nil && res.Error != "" {
		err = errors.New(res.Error)
	}
	if err != nil {
		smp.Error = err.Error()
		smp.cancelled = ctx.Err() != nil
	} else {
		smp.PromptTokens, smp.CachedTokens, smp.OutputTokens = reply.PromptTokens, reply.CachedTokens, reply.CompletionTokens
	}
	if s.user == nil {
		r.turns.end(s.index)
	}
	if u := s.user; u != nil {
		u.round++
		if err == nil && u.round < len(u.conv.Questions) {
			u.history = append(u.history, Message{Role: "assistant", Content: reply.Content})
			r.ready <- u
		} else {
			r.finished++
			if r.finished == len(r.plan.Conversations) {
				close(r.done)
			}
		}
	}
	return smp
}

// giveUp is called when the targeter cannot send s: requests waiting on it are woken, and the
// attack stops (vegeta stops on a targeter error).
func (r *run) giveUp(s *sent) {
	if s.user == nil {
		r.turns.end(s.index)
		r.turns.fail()
	}
}

// countPacer paces hits every interval (open loop) or as fast as workers free up (interval 0,
// closed loop), and stops after limit hits.
type countPacer struct {
	interval time.Duration
	limit    uint64
}

func (p *countPacer) Pace(elapsed time.Duration, hits uint64) (time.Duration, bool) {
	if hits >= p.limit {
		return 0, true
	}
	return time.Duration(hits)*p.interval - elapsed, false
}

func (p *countPacer) Rate(time.Duration) float64 {
	if p.interval <= 0 {
		return math.Inf(1)
	}
	return float64(time.Second) / float64(p.interval)
}

var _ vegeta.Pacer = (*countPacer)(nil)

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
