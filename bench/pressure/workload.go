package pressure

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"

	"github.com/rolter-ai/rolter/bench/data"
	"github.com/rolter-ai/rolter/bench/replay"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

// The workloads of the KV-pressure report. Each is an explicit plan (loadtest.Plan with
// Requests), generated from a seed before the run, so every strategy is sent exactly the same prompts and the
// working set and the oracles can be computed from the plan itself. Prompts are made of three-letter words,
// each (with its leading space) exactly one token of the sim's tokenizer, so token counts are exact.

// Names of the pressure workloads.
const (
	// SharedPrefix: Groups system prompts of SystemMin..SystemMax tokens, each request one of them
	// drawn with Zipf(ZipfS) popularity, followed by a question of QuestionTokens that no other request has.
	SharedPrefix = "shared-prefix"
	// SharedPrefixSkewed is SharedPrefix with the first report's Zipf s=1.1: so few prompts
	// carry the traffic that every engine's cache holds them under any routing, and the placement reference
	// is only 1.40x the round-robin LRU model at 50% (a "2x round robin" goal is out of reach by
	// construction). It stays in the report so the change of exponent hides nothing.
	SharedPrefixSkewed = "shared-prefix-s1.1"
	// MultiTurn: Conversations conversations of TurnsMin..TurnsMax turns. A conversation opens with
	// one of Agents shared system prompts (AgentTokens) and its own first user message (OpeningTokens); each
	// further turn is the previous turn's messages + an assistant answer (AnswerTokens) + a new user message
	// (QuestionTokens), so every turn's prompt extends the previous one. At most Active conversations are
	// open at once; the plan interleaves them at random, and a turn is sent only after its conversation's
	// previous turn was answered.
	MultiTurn = "multi-turn"
	// MultiTurnShort is MultiTurn with the first report's short messages (a 384-token
	// opening, 96-token answers, 48-token questions): the 4 agent prompts every conversation shares are a
	// fifth of its tokens and every engine holds them under any routing, so the placement reference is only
	// 2.07x the round-robin LRU model at 50% and a "2x round robin" goal sits at the ceiling of any router.
	// It stays in the report, not judged, so the change of shape hides nothing.
	MultiTurnShort = "multi-turn-short"
	// HotBurst: the shared-prefix traffic (Groups, Zipf) with a burst in the middle: from BurstStart
	// to BurstEnd (fractions of the requests) a request uses the one hot prefix (HotTokens) with probability
	// HotShare. Each request has its own question.
	HotBurst = "hot-prefix-burst"
	// Mooncake: the Mooncake FAST'25 synthetic trace (bench/data), production-shaped - chained 512-token
	// prefix blocks, long multi-turn agent contexts, arrival order kept - with every token count divided by
	// TraceScale (the sharing between prompts is kept exactly; replay.TracePlan) and at most TraceRequests
	// requests, sent in trace order.
	Mooncake = "mooncake"
)

// WorkloadNames lists the workloads in report order.
var WorkloadNames = []string{SharedPrefix, SharedPrefixSkewed, MultiTurn, MultiTurnShort, HotBurst, Mooncake}

// Workload is one workload of the KV-pressure report. Token counts are content tokens; the chat
// template adds its markers (loadtest.TemplateTokens).
type Workload struct {
	Name string `json:"name"`
	Seed uint64 `json:"seed"`
	// Requests of shared-prefix and hot-prefix-burst (multi-turn: the sum of the conversations' turns).
	Requests       int     `json:"requests,omitempty"`
	Groups         int     `json:"groups,omitempty"`
	SystemMin      int     `json:"system_min_tokens,omitempty"`
	SystemMax      int     `json:"system_max_tokens,omitempty"`
	ZipfS          float64 `json:"zipf_s,omitempty"`
	QuestionTokens int     `json:"question_tokens"`
	OutputTokens   int     `json:"output_tokens"`

	Conversations int `json:"conversations,omitempty"`
	TurnsMin      int `json:"turns_min,omitempty"`
	TurnsMax      int `json:"turns_max,omitempty"`
	Active        int `json:"active,omitempty"`
	Agents        int `json:"agents,omitempty"`
	AgentTokens   int `json:"agent_tokens,omitempty"`
	OpeningTokens int `json:"opening_tokens,omitempty"`
	AnswerTokens  int `json:"answer_tokens,omitempty"`

	HotTokens  int     `json:"hot_tokens,omitempty"`
	BurstStart float64 `json:"burst_start,omitempty"`
	BurstEnd   float64 `json:"burst_end,omitempty"`
	HotShare   float64 `json:"hot_share,omitempty"`

	TraceScale    int `json:"trace_scale,omitempty"`
	TraceRequests int `json:"trace_requests,omitempty"`
}

// DefaultWorkload returns the full-size workload of name (quick: the small one of the test and of
// -quick), with seed.
func DefaultWorkload(name string, quick bool, seed uint64) Workload {
	w := Workload{Name: name, Seed: seed, QuestionTokens: 64, OutputTokens: 16}
	switch name {
	case SharedPrefix, SharedPrefixSkewed:
		// Zipf s=0.6 over 128 prompts: the popular prompts no longer fit in every engine's cache at once,
		// so where a prompt is placed decides whether it is cached (at 50% the placement reference
		// is 2.5x the round-robin LRU model; at s=1.1, 1.4x). The s=1.1 shape runs as shared-prefix-s1.1.
		w.Requests, w.Groups, w.SystemMin, w.SystemMax, w.ZipfS = 3000, 128, 1024, 4096, 0.6
		if name == SharedPrefixSkewed {
			w.ZipfS = 1.1
		}
		if quick {
			w.Requests, w.Groups, w.SystemMin, w.SystemMax, w.QuestionTokens = 64, 8, 64, 192, 24
		}
	case MultiTurn, MultiTurnShort:
		// Each conversation opens on a pasted document (1024 tokens) and its turns have the message sizes of
		// real chat: LMSYS-Chat-1M averages 69.5 tokens per user prompt and 214.5 per response (Zheng et al.
		// 2023, table 1). Most of a prompt is then the conversation's own history, which only its engine
		// can hold (at 50% the placement reference is 2.5x the round-robin LRU model). The first
		// report's shorter messages run as multi-turn-short.
		w.Conversations, w.TurnsMin, w.TurnsMax, w.Active = 320, 4, 12, 200
		w.Agents, w.AgentTokens, w.OpeningTokens, w.AnswerTokens, w.QuestionTokens = 4, 256, 1024, 256, 64
		if name == MultiTurnShort {
			w.OpeningTokens, w.AnswerTokens, w.QuestionTokens = 384, 96, 48
		}
		if quick {
			w.Conversations, w.TurnsMin, w.TurnsMax, w.Active = 12, 2, 6, 6
			w.Agents, w.AgentTokens, w.OpeningTokens, w.AnswerTokens, w.QuestionTokens = 2, 96, 48, 24, 16
		}
	case HotBurst:
		w.Requests, w.Groups, w.SystemMin, w.SystemMax, w.ZipfS = 3000, 64, 1024, 4096, 1.1
		w.HotTokens, w.BurstStart, w.BurstEnd, w.HotShare = 4096, 0.25, 0.75, 0.85
		if quick {
			w.Requests, w.Groups, w.SystemMin, w.SystemMax, w.QuestionTokens = 64, 4, 64, 192, 24
			w.HotTokens = 256
		}
	case Mooncake:
		// 512-token blocks become 32 tokens (two of the sim's blocks): prompts of 13-11,961 tokens, 958 on
		// average, and outputs of 1-56 tokens.
		w.TraceScale, w.TraceRequests, w.QuestionTokens, w.OutputTokens = 16, 0, 0, 0
		if quick {
			w.TraceScale, w.TraceRequests = 32, 200
		}
	}
	return w
}

// Validate reports every problem of w at once.
func (w *Workload) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if w.Name != Mooncake && (w.QuestionTokens < 2 || w.OutputTokens < 1) {
		bad("question tokens %d must be >= 2 and output tokens %d >= 1", w.QuestionTokens, w.OutputTokens)
	}
	switch w.Name {
	case SharedPrefix, SharedPrefixSkewed, HotBurst:
		if w.Requests < 1 || w.Requests > 1_000_000 || w.Groups < 1 {
			bad("requests %d (1..1000000) and groups %d must be positive", w.Requests, w.Groups)
		}
		if w.SystemMin < 2 || w.SystemMax < w.SystemMin {
			bad("system tokens %d..%d: want 2 <= min <= max", w.SystemMin, w.SystemMax)
		}
		if !(w.ZipfS > 0) || w.ZipfS > 10 {
			bad("zipf exponent must be in (0, 10], got %v", w.ZipfS)
		}
		if w.Name == HotBurst {
			if w.HotTokens < 2 || !(w.BurstStart >= 0 && w.BurstStart < w.BurstEnd && w.BurstEnd <= 1) ||
				!(w.HotShare > 0 && w.HotShare <= 1) {
				bad("hot burst: hot tokens %d >= 2, 0 <= start %v < end %v <= 1, 0 < share %v <= 1", w.HotTokens,
					w.BurstStart, w.BurstEnd, w.HotShare)
			}
		}
	case MultiTurn, MultiTurnShort:
		if w.Conversations < 1 || w.TurnsMin < 1 || w.TurnsMax < w.TurnsMin || w.Conversations*w.TurnsMax > 1_000_000 {
			bad("conversations %d and turns %d..%d: want positive, min <= max, at most 1000000 requests",
				w.Conversations, w.TurnsMin, w.TurnsMax)
		}
		if w.Active < 1 || w.Agents < 1 || w.AgentTokens < 2 || w.OpeningTokens < 2 || w.AnswerTokens < 1 {
			bad("active %d, agents %d, agent %d, opening %d and answer %d tokens must be positive (agent and opening >= 2)",
				w.Active, w.Agents, w.AgentTokens, w.OpeningTokens, w.AnswerTokens)
		}
	case Mooncake:
		if w.TraceScale < 1 || w.TraceScale > 512 || w.TraceRequests < 0 {
			bad("trace scale %d must be in 1..512 and trace requests %d >= 0 (0: all)", w.TraceScale, w.TraceRequests)
		}
	default:
		bad("unknown pressure workload %q", w.Name)
	}
	if len(errs) > 0 {
		return fmt.Errorf("cannot use workload %q: %w", w.Name, errors.Join(errs...))
	}
	return nil
}

// hotGroup is the Group of the hot-prefix requests of HotBurst: one past the background groups.
func (w *Workload) hotGroup() int { return w.Groups }

// Plan generates the explicit plan of w: the same w (seed included) gives the same plan. Request.Group is
// the shared-prefix group (the hot prefix is group Groups) or the conversation; a multi-turn request waits
// for its conversation's previous turn (Request.After).
func (w Workload) Plan() (*loadtest.Plan, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	// Each part of the text draws from its own stream, so one knob does not reshuffle the rest.
	rng := func(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(w.Seed, stream)) }
	p := &loadtest.Plan{Workload: loadtest.Workload{Scenario: w.Name, Seed: w.Seed, OutputTokens: w.OutputTokens}}
	switch w.Name {
	case SharedPrefix, SharedPrefixSkewed, HotBurst:
		w.sharedPrefixRequests(p, rng)
	case MultiTurn, MultiTurnShort:
		w.multiTurnRequests(p, rng)
	case Mooncake:
		return w.tracePlan()
	}
	return p, nil
}

// tracePlan is the plan of Mooncake: the trace's requests in its order, each prompt one user message of
// synthetic text sharing exactly the blocks the trace's prompts shared.
func (w Workload) tracePlan() (*loadtest.Plan, error) {
	tr, err := capture.Read(bytes.NewReader(data.Mooncake))
	if err != nil {
		return nil, fmt.Errorf("cannot read the Mooncake trace: %w", err)
	}
	p, _, err := replay.TracePlan(&tr, replay.PlanOptions{Scale: w.TraceScale, MaxRequests: w.TraceRequests})
	if err != nil {
		return nil, err
	}
	p.Workload.Scenario = w.Name
	return p, nil
}

// sharedPrefixRequests appends the requests of a shared-prefix workload (with HotBurst's hot prefix) to p:
// a Zipf-drawn system prompt and a question of its own each.
func (w Workload) sharedPrefixRequests(p *loadtest.Plan, rng func(stream uint64) *rand.Rand) {
	text, order, sizes := rng(1), rng(2), rng(3)
	systems := make([]string, w.Groups)
	for g := range systems {
		systems[g] = phrase(text, w.SystemMin+sizes.IntN(w.SystemMax-w.SystemMin+1), 1, uint64(g))
	}
	hot := ""
	if w.Name == HotBurst {
		hot = phrase(text, w.HotTokens, 2, 0)
	}
	z := newZipf(order, w.ZipfS, w.Groups)
	lo, hi := int(w.BurstStart*float64(w.Requests)), int(w.BurstEnd*float64(w.Requests))
	for i := 0; i < w.Requests; i++ {
		g := int(z.Uint64())
		system := systems[g]
		if hot != "" && i >= lo && i < hi && order.Float64() < w.HotShare {
			g, system = w.hotGroup(), hot
		}
		p.Requests = append(p.Requests, loadtest.Request{Group: g, Messages: []loadtest.Message{
			{Role: "system", Content: system},
			{Role: "user", Content: phrase(text, w.QuestionTokens, 3, uint64(i))},
		}})
	}
}

// multiTurnRequests appends the turns of Active conversations open at once to p, a conversation's next
// turn its previous prompt plus an answer and a question.
func (w Workload) multiTurnRequests(p *loadtest.Plan, rng func(stream uint64) *rand.Rand) {
	text, order := rng(1), rng(2)
	agents := make([]string, w.Agents)
	for a := range agents {
		agents[a] = phrase(text, w.AgentTokens, 1, uint64(a))
	}
	type conv struct {
		id, turns, sent int
		msgs            []loadtest.Message
		last            int // 1 + plan index of the previous turn
	}
	start := func(id int) *conv {
		c := &conv{id: id, turns: w.TurnsMin + order.IntN(w.TurnsMax-w.TurnsMin+1)}
		c.msgs = []loadtest.Message{
			{Role: "system", Content: agents[order.IntN(w.Agents)]},
			{Role: "user", Content: phrase(text, w.OpeningTokens, 4, uint64(id))},
		}
		return c
	}
	var active []*conv
	next := 0
	for next < w.Conversations && len(active) < w.Active {
		active = append(active, start(next))
		next++
	}
	for len(active) > 0 {
		k := order.IntN(len(active))
		c := active[k]
		if c.sent > 0 {
			c.msgs = append(c.msgs,
				loadtest.Message{Role: "assistant", Content: phrase(text, w.AnswerTokens, 5, uint64(c.id))},
				loadtest.Message{Role: "user", Content: phrase(text, w.QuestionTokens, 6, uint64(c.id))})
		}
		// The messages so far, shared with later turns' slices only up to their own length.
		msgs := c.msgs[:len(c.msgs):len(c.msgs)]
		p.Requests = append(p.Requests, loadtest.Request{Group: c.id, Messages: msgs, After: c.last})
		c.last = len(p.Requests)
		c.sent++
		if c.sent == c.turns {
			if next < w.Conversations {
				active[k] = start(next)
				next++
			} else {
				active = append(active[:k], active[k+1:]...)
			}
		}
	}
}

// zipf draws group ranks 0..n-1 with P(k) proportional to (k+1)^-s. Exponents above 1 use
// math/rand/v2's Zipf (the sampler the s=1.1 plans were generated with, so they stay the same); s <= 1, which
// it does not take, inverts the cumulative distribution.
type zipf struct {
	z   *rand.Zipf
	rng *rand.Rand
	cdf []float64
}

func newZipf(rng *rand.Rand, s float64, n int) *zipf {
	if s > 1 {
		return &zipf{z: rand.NewZipf(rng, s, 1, uint64(n-1))}
	}
	z := &zipf{rng: rng, cdf: make([]float64, n)}
	sum := 0.0
	for k := range z.cdf {
		sum += math.Pow(float64(k+1), -s)
		z.cdf[k] = sum
	}
	for k := range z.cdf {
		z.cdf[k] /= sum
	}
	return z
}

func (z *zipf) Uint64() uint64 {
	if z.z != nil {
		return z.z.Uint64()
	}
	u := z.rng.Float64()
	return uint64(min(sort.SearchFloat64s(z.cdf, u), len(z.cdf)-1))
}

// wordSpace is the number of three-letter lowercase words.
const wordSpace = 26 * 26 * 26

// phrase returns n tokens of three-letter words (wordSpace of them, as the replay report's prompts). The first two words spell (kind, id) - kind in the
// first word, id in the rest of it and the second - so texts of different ids differ from their first token
// on; the rest are random.
func phrase(rng *rand.Rand, n int, kind, id uint64) string {
	b := make([]byte, 0, 4*n)
	put := func(v uint64) {
		if len(b) > 0 {
			b = append(b, ' ')
		}
		v %= wordSpace
		b = append(b, byte('a'+v/676), byte('a'+v/26%26), byte('a'+v%26))
	}
	put(kind*wordSpace/8 + id/wordSpace%(wordSpace/8))
	if n > 1 {
		put(id % wordSpace)
	}
	for k := 2; k < n; k++ {
		put(uint64(rng.IntN(wordSpace)))
	}
	return string(b)
}

// PlanStats describe a pressure plan's prompts in KV blocks.
type PlanStats struct {
	Requests int `json:"requests"`
	// PromptTokens is the sum of the prompts' tokens (chat template included).
	PromptTokens int64 `json:"prompt_tokens"`
	// Blocks is the working set: the distinct full prompt blocks of the plan (a block is its tokens after
	// the tokens before it, as the engine's chained hashes name it). Reused are those that a later prompt
	// of the plan shares.
	Blocks int `json:"blocks"`
	Reused int `json:"reused_blocks"`
	// MaxRequestBlocks is the most blocks one request takes on an engine: its prompt and its output tokens.
	MaxRequestBlocks int `json:"max_request_blocks"`
	// OracleHitRate is the infinite-cache bound over the plan's order (loadtest.Oracle).
	OracleHitRate float64 `json:"oracle_hit_rate"`
}

// planStats computes the working set of p with blocks of blockSize tokens.
func planStats(p *loadtest.Plan, blockSize int) PlanStats {
	st := PlanStats{Requests: len(p.Requests)}
	oracle := loadtest.NewOracle(blockSize)
	var tokens []uint32
	for i := range p.Requests {
		r := &p.Requests[i]
		tokens = appendTokens(tokens[:0], r.Messages)
		oracle.AddTokens(tokens)
		st.PromptTokens += int64(len(tokens))
		out := r.MaxTokens
		if out == 0 {
			out = p.Workload.OutputTokens
		}
		st.MaxRequestBlocks = max(st.MaxRequestBlocks, (len(tokens)+out+blockSize-1)/blockSize)
	}
	st.Blocks, st.Reused, st.OracleHitRate = oracle.Blocks(), oracle.ReusedBlocks(), oracle.HitRate()
	return st
}

// appendTokens appends the sim's tokens of msgs (chat template and generation prompt) to dst.
func appendTokens(dst []uint32, msgs []loadtest.Message) []uint32 {
	pairs := make([][2][]byte, len(msgs))
	for i, m := range msgs {
		pairs[i] = [2][]byte{[]byte(m.Role), []byte(m.Content)}
	}
	return sim.AppendChatTokens(dst, pairs, true)
}
