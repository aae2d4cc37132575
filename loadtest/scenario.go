package loadtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Scenario names.
const (
	// SharedPrefix is SGLang's generated-shared-prefix (GSP) shape: Groups system prompts of
	// SystemTokens each, PromptsPerGroup questions of QuestionTokens per group, shuffled.
	SharedPrefix = "shared-prefix"
	// MultiTurn is production-stack's multi-round QA shape: Users conversations of Rounds rounds
	// each; a user's next round carries the whole history and is sent after the previous answer.
	MultiTurn = "multi-turn"
	// HotPrefix is the hot-prefix stress: every request shares one SystemTokens prefix and has a
	// unique QuestionTokens suffix.
	HotPrefix = "hot-prefix"
	// Random is unrelated prompts of QuestionTokens each: nothing to share.
	Random = "random"
)

// Scenarios lists every scenario name.
var Scenarios = []string{SharedPrefix, MultiTurn, HotPrefix, Random}

// Popularity of the shared-prefix groups.
const (
	// Uniform gives every group exactly PromptsPerGroup requests.
	Uniform = "uniform"
	// Zipf draws each request's group from a Zipf distribution (group 0 the most popular).
	Zipf = "zipf"
)

// Workload describes the requests of one run. Token counts are content tokens of the sim's
// tokenizer (sim.AppendTokens): the chat template adds its markers on top (a system + user
// request carries 14 more tokens, see TemplateTokens). Which fields a scenario reads:
//
//	shared-prefix  Groups, PromptsPerGroup, SystemTokens, QuestionTokens, Popularity, ZipfS
//	multi-turn     Users, Rounds, SystemTokens (shared by all users), HistoryTokens (per user),
//	               QuestionTokens (per round)
//	hot-prefix     Requests, SystemTokens (the shared prefix), QuestionTokens (the unique suffix)
//	random         Requests, QuestionTokens
//
// OutputTokens (max_tokens) and Seed apply to all.
type Workload struct {
	Scenario        string  `json:"scenario"`
	Seed            uint64  `json:"seed"`
	Groups          int     `json:"groups,omitempty"`
	PromptsPerGroup int     `json:"prompts_per_group,omitempty"`
	Popularity      string  `json:"popularity,omitempty"`
	ZipfS           float64 `json:"zipf_s,omitempty"`
	Users           int     `json:"users,omitempty"`
	Rounds          int     `json:"rounds,omitempty"`
	HistoryTokens   int     `json:"history_tokens,omitempty"`
	Requests        int     `json:"requests,omitempty"`
	SystemTokens    int     `json:"system_tokens"`
	QuestionTokens  int     `json:"question_tokens"`
	OutputTokens    int     `json:"output_tokens"`
}

// TemplateTokens is what the sim's chat template adds to a request made of one system and one
// user message: <im_start> "syst" "em" <role_end> … <im_end> (5), <im_start> "user" <role_end>
// … <im_end> (4), and the generation prompt <im_start> "assi" "stan" "t" <role_end> (5).
const TemplateTokens = 14

// maxPlanRequests bounds a generated plan, so a typo cannot ask for a billion prompts.
const maxPlanRequests = 1_000_000

// Message is one chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one planned request of a static scenario (all but multi-turn), or of an explicit
// plan (Options.Plan, a replayed trace), which may also set the fields after Messages.
type Request struct {
	// Group is the shared-prefix group, or -1.
	Group    int
	Messages []Message
	// MaxTokens, when > 0, is this request's max_tokens instead of the workload's OutputTokens.
	MaxTokens int
	// Model, when set, is this request's model instead of Options.Model (a LoRA adapter, say).
	Model string
	// Session, when set, is sent as x-session-id.
	Session string
	// At is when the request is sent, from the start of the run, in a Timed plan.
	At time.Duration
	// After, when > 0, is 1 + the index of an earlier request of the plan that must have been
	// answered (or have failed) before this one is sent: the previous turn of its session.
	After int
}

// Conversation is one multi-turn user: Prefix (system) messages, then one question per round;
// the answers come from the server at run time.
type Conversation struct {
	User      int
	Prefix    []Message
	Questions []string
}

// Plan is a generated workload. Exactly one of Requests (static scenarios, in send order) and
// Conversations (multi-turn) is set.
type Plan struct {
	Workload      Workload
	Requests      []Request
	Conversations []Conversation
	// Timed makes the run open loop at the requests' At times (an explicit plan only).
	Timed bool
}

// Size returns the number of requests the plan sends when every request succeeds.
func (p *Plan) Size() int {
	if p.Conversations != nil {
		n := 0
		for i := range p.Conversations {
			n += len(p.Conversations[i].Questions)
		}
		return n
	}
	return len(p.Requests)
}

// DefaultWorkload returns the default knobs of a scenario: SGLang's GSP shape and the routing
// report's other shapes, scaled down by 4 in tokens (see bench/README.md).
func DefaultWorkload(scenario string) Workload {
	w := Workload{Scenario: scenario, Seed: 1, OutputTokens: 64}
	switch scenario {
	case SharedPrefix:
		w.Groups, w.PromptsPerGroup, w.Popularity, w.ZipfS = 64, 16, Uniform, 1.1
		w.SystemTokens, w.QuestionTokens = 512, 32
	case MultiTurn:
		w.Users, w.Rounds = 32, 8
		w.SystemTokens, w.HistoryTokens, w.QuestionTokens = 512, 256, 32
	case HotPrefix:
		w.Requests, w.SystemTokens, w.QuestionTokens = 512, 2048, 32
	case Random:
		w.Requests, w.QuestionTokens = 256, 544
	}
	return w
}

// Validate reports every problem of w at once.
func (w *Workload) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	positive := func(name string, v int) {
		if v <= 0 {
			bad("%s must be > 0, got %d", name, v)
		}
	}
	if w.OutputTokens <= 0 {
		bad("output tokens must be > 0, got %d", w.OutputTokens)
	}
	total := 0
	switch w.Scenario {
	case SharedPrefix:
		positive("groups", w.Groups)
		positive("prompts per group", w.PromptsPerGroup)
		positive("system tokens", w.SystemTokens)
		positive("question tokens", w.QuestionTokens)
		switch w.Popularity {
		case Uniform, "":
		case Zipf:
			if !(w.ZipfS > 1) {
				bad("zipf exponent must be > 1, got %v", w.ZipfS)
			}
		default:
			bad("unknown popularity %q; want %q or %q", w.Popularity, Uniform, Zipf)
		}
		total = w.Groups * w.PromptsPerGroup
		if w.Groups > 0 && w.SystemTokens > 0 && w.SystemTokens < idWidth(w.Groups) {
			bad("system tokens %d too few to tell %d groups apart", w.SystemTokens, w.Groups)
		}
		if w.PromptsPerGroup > 0 && w.QuestionTokens > 0 && w.QuestionTokens < idWidth(w.PromptsPerGroup*w.Groups) {
			bad("question tokens %d too few to tell the questions apart", w.QuestionTokens)
		}
	case MultiTurn:
		positive("users", w.Users)
		positive("rounds", w.Rounds)
		positive("question tokens", w.QuestionTokens)
		if w.SystemTokens < 0 || w.HistoryTokens < 0 {
			bad("system and history tokens must not be negative")
		}
		if w.Users > 0 && w.HistoryTokens > 0 && w.HistoryTokens < idWidth(w.Users) {
			bad("history tokens %d too few to tell %d users apart", w.HistoryTokens, w.Users)
		}
		total = w.Users * w.Rounds
	case HotPrefix:
		positive("requests", w.Requests)
		positive("system tokens", w.SystemTokens)
		positive("question tokens", w.QuestionTokens)
		if w.Requests > 0 && w.QuestionTokens > 0 && w.QuestionTokens < idWidth(w.Requests) {
			bad("question tokens %d too few to tell %d requests apart", w.QuestionTokens, w.Requests)
		}
		total = w.Requests
	case Random:
		positive("requests", w.Requests)
		positive("question tokens", w.QuestionTokens)
		if w.Requests > 0 && w.QuestionTokens > 0 && w.QuestionTokens < idWidth(w.Requests) {
			bad("question tokens %d too few to tell %d requests apart", w.QuestionTokens, w.Requests)
		}
		total = w.Requests
	default:
		bad("unknown scenario %q; want one of %s", w.Scenario, strings.Join(Scenarios, ", "))
	}
	if total > maxPlanRequests {
		bad("workload has %d requests; at most %d", total, maxPlanRequests)
	}
	return errors.Join(errs...)
}

// Generate builds the plan of w. The same Workload (Seed included) gives the same plan.
func (w Workload) Generate() (*Plan, error) {
	if w.Scenario == SharedPrefix && w.Popularity == "" {
		w.Popularity = Uniform
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("cannot generate workload: %w", err)
	}
	// Each part of the text draws from its own stream, so changing one knob (say the question
	// length) does not reshuffle everything else.
	rng := func(stream uint64) *rand.Rand { return rand.New(rand.NewPCG(w.Seed, stream)) }
	p := &Plan{Workload: w}
	switch w.Scenario {
	case SharedPrefix:
		text := rng(1)
		systems := make([]string, w.Groups)
		for g := range systems {
			systems[g] = words(text, w.SystemTokens, g, idWidth(w.Groups))
		}
		order := rng(2)
		var groups []int
		if w.Popularity == Zipf {
			z := rand.NewZipf(order, w.ZipfS, 1, uint64(w.Groups-1))
			groups = make([]int, w.Groups*w.PromptsPerGroup)
			for i := range groups {
				groups[i] = int(z.Uint64())
			}
		} else {
			for g := 0; g < w.Groups; g++ {
				for range w.PromptsPerGroup {
					groups = append(groups, g)
				}
			}
			order.Shuffle(len(groups), func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
		}
		width := idWidth(w.Groups * w.PromptsPerGroup)
		for i, g := range groups {
			p.Requests = append(p.Requests, Request{Group: g, Messages: []Message{
				{Role: "system", Content: systems[g]},
				{Role: "user", Content: words(text, w.QuestionTokens, i, width)},
			}})
		}
	case MultiTurn:
		text := rng(1)
		shared := words(text, w.SystemTokens, -1, 0)
		qWidth := idWidth(w.Users * w.Rounds)
		for u := 0; u < w.Users; u++ {
			c := Conversation{User: u}
			system := joinWords(shared, words(text, w.HistoryTokens, u, idWidth(w.Users)))
			if system != "" {
				c.Prefix = []Message{{Role: "system", Content: system}}
			}
			for r := 0; r < w.Rounds; r++ {
				c.Questions = append(c.Questions, words(text, w.QuestionTokens, u*w.Rounds+r, qWidth))
			}
			p.Conversations = append(p.Conversations, c)
		}
	case HotPrefix:
		text := rng(1)
		prefix := words(text, w.SystemTokens, -1, 0)
		width := idWidth(w.Requests)
		for i := 0; i < w.Requests; i++ {
			p.Requests = append(p.Requests, Request{Group: 0, Messages: []Message{
				{Role: "system", Content: prefix},
				{Role: "user", Content: words(text, w.QuestionTokens, i, width)},
			}})
		}
	case Random:
		text := rng(1)
		width := idWidth(w.Requests)
		for i := 0; i < w.Requests; i++ {
			p.Requests = append(p.Requests, Request{Group: -1, Messages: []Message{
				{Role: "user", Content: words(text, w.QuestionTokens, i, width)},
			}})
		}
	}
	return p, nil
}

// Text is made of three-letter words: "abc def ghi". With the sim's tokenizer (pieces of at
// most 4 bytes, whitespace going with the word after it) every word is exactly one token, so n
// words are n tokens and a token count is hit exactly.

const wordSpace = 26 * 26 * 26

// idWidth is the number of words that spell ids 0..n-1 apart.
func idWidth(n int) int {
	w := 1
	for c := wordSpace; c < n; c *= wordSpace {
		w++
	}
	return w
}

// words returns n tokens of text. When id >= 0 the first width words spell id, so texts with
// different ids differ from their first token on (prefixes that must not be shared are not); the
// rest are random words.
func words(rng *rand.Rand, n, id, width int) string {
	if n <= 0 {
		return ""
	}
	b := make([]byte, 0, 4*n)
	put := func(v int) {
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = append(b, byte('a'+v/676), byte('a'+v/26%26), byte('a'+v%26))
	}
	k := 0
	if id >= 0 {
		digits := make([]int, width)
		for i, v := width-1, id; i >= 0; i-- {
			digits[i] = v % wordSpace
			v /= wordSpace
		}
		for ; k < width && k < n; k++ {
			put(digits[k])
		}
	}
	for ; k < n; k++ {
		put(rng.IntN(wordSpace))
	}
	return string(b)
}

func joinWords(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + " " + b
}
