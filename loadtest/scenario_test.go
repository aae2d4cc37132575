package loadtest

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/sim"
)

func tokens(s string) int { return len(sim.AppendTokens(nil, []byte(s))) }

func TestGenerateDeterministic(t *testing.T) {
	f := func(w Workload) {
		t.Helper()
		a, err := w.Generate()
		if err != nil {
			t.Fatalf("%s: %s", w.Scenario, err)
		}
		b, err := w.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two plans from the same seed differ", w.Scenario)
		}
		w.Seed++
		c, err := w.Generate()
		if err != nil {
			t.Fatal(err)
		}
		if reflect.DeepEqual(a.Requests, c.Requests) && reflect.DeepEqual(a.Conversations, c.Conversations) {
			t.Fatalf("%s: seeds %d and %d gave the same plan", w.Scenario, w.Seed-1, w.Seed)
		}
	}
	for _, s := range Scenarios {
		w := DefaultWorkload(s)
		w.Groups, w.PromptsPerGroup, w.Users, w.Rounds, w.Requests = 4, 3, 3, 2, 5
		f(w)
	}
	w := DefaultWorkload(SharedPrefix)
	w.Popularity = Zipf
	f(w)
}

// TestTokenCounts: every text is exactly the asked number of tokens of the sim's tokenizer.
func TestTokenCounts(t *testing.T) {
	f := func(sys, q int) {
		t.Helper()
		w := Workload{Scenario: SharedPrefix, Seed: 7, Groups: 3, PromptsPerGroup: 2, SystemTokens: sys, QuestionTokens: q, OutputTokens: 1}
		p, err := w.Generate()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Requests {
			if got := tokens(r.Messages[0].Content); got != sys {
				t.Fatalf("system: %d tokens, want %d", got, sys)
			}
			if got := tokens(r.Messages[1].Content); got != q {
				t.Fatalf("question: %d tokens, want %d", got, q)
			}
			if got := PromptTokens(r.Messages); got != sys+q+TemplateTokens {
				t.Fatalf("prompt: %d tokens, want %d", got, sys+q+TemplateTokens)
			}
		}
	}
	f(1, 1)
	f(16, 2)
	f(512, 32)
	f(2048, 128)
}

func TestSharedPrefixShape(t *testing.T) {
	w := Workload{Scenario: SharedPrefix, Seed: 3, Groups: 8, PromptsPerGroup: 5, SystemTokens: 40, QuestionTokens: 6, OutputTokens: 4}
	p, err := w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	perGroup := map[int]int{}
	systems := map[int]string{}
	questions := map[string]bool{}
	inOrder := true
	for i, r := range p.Requests {
		perGroup[r.Group]++
		if s, ok := systems[r.Group]; ok && s != r.Messages[0].Content {
			t.Fatalf("group %d has two system prompts", r.Group)
		}
		systems[r.Group] = r.Messages[0].Content
		if questions[r.Messages[1].Content] {
			t.Fatalf("question %q repeats", r.Messages[1].Content)
		}
		questions[r.Messages[1].Content] = true
		if i > 0 && r.Group < p.Requests[i-1].Group {
			inOrder = false
		}
	}
	if len(perGroup) != 8 {
		t.Fatalf("%d groups, want 8", len(perGroup))
	}
	for g, n := range perGroup {
		if n != 5 {
			t.Fatalf("group %d has %d prompts, want 5", g, n)
		}
	}
	if inOrder {
		t.Fatalf("uniform requests were not shuffled")
	}
	// Different groups differ from the first token on, so they share no KV block.
	firsts := map[string]bool{}
	for _, s := range systems {
		firsts[strings.Fields(s)[0]] = true
	}
	if len(firsts) != 8 {
		t.Fatalf("groups share first words: %v", firsts)
	}

	// Zipf: group 0 is the most popular, the total is unchanged.
	w.Popularity, w.ZipfS, w.Groups, w.PromptsPerGroup = Zipf, 1.2, 16, 64
	p, err = w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 16)
	for _, r := range p.Requests {
		counts[r.Group]++
	}
	if len(p.Requests) != 16*64 {
		t.Fatalf("zipf plan has %d requests, want %d", len(p.Requests), 16*64)
	}
	for g := 1; g < 16; g++ {
		if counts[g] > counts[0] {
			t.Fatalf("zipf: group %d (%d) more popular than group 0 (%d)", g, counts[g], counts[0])
		}
	}
	if counts[0] < 2*counts[15] {
		t.Fatalf("zipf popularity too flat: %v", counts)
	}
}

func TestMultiTurnShape(t *testing.T) {
	w := Workload{Scenario: MultiTurn, Seed: 1, Users: 3, Rounds: 4, SystemTokens: 20, HistoryTokens: 10, QuestionTokens: 5, OutputTokens: 3}
	p, err := w.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 12 || len(p.Conversations) != 3 {
		t.Fatalf("size %d, conversations %d; want 12, 3", p.Size(), len(p.Conversations))
	}
	sys0 := p.Conversations[0].Prefix[0].Content
	for _, c := range p.Conversations {
		s := c.Prefix[0].Content
		if tokens(s) != 30 {
			t.Fatalf("user %d system: %d tokens, want 30", c.User, tokens(s))
		}
		// The first 20 words are shared by every user, the rest is the user's own.
		if strings.Join(strings.Fields(s)[:20], " ") != strings.Join(strings.Fields(sys0)[:20], " ") {
			t.Fatalf("user %d does not share the system prompt", c.User)
		}
		if c.User > 0 && s == sys0 {
			t.Fatalf("user %d has user 0's history", c.User)
		}
		if len(c.Questions) != 4 {
			t.Fatalf("user %d has %d questions", c.User, len(c.Questions))
		}
	}
}

func TestWorkloadValidate(t *testing.T) {
	f := func(w Workload, want string) {
		t.Helper()
		err := w.Validate()
		if want == "" {
			if err != nil {
				t.Fatalf("unexpected error: %s", err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v; want an error containing %q", err, want)
		}
	}
	f(DefaultWorkload(SharedPrefix), "")
	f(DefaultWorkload(MultiTurn), "")
	f(DefaultWorkload(HotPrefix), "")
	f(DefaultWorkload(Random), "")
	f(Workload{Scenario: "nope", OutputTokens: 1}, "unknown scenario")
	w := DefaultWorkload(SharedPrefix)
	w.Groups = 0
	f(w, "groups must be > 0")
	w = DefaultWorkload(SharedPrefix)
	w.Popularity, w.ZipfS = Zipf, 1
	f(w, "zipf exponent")
	w = DefaultWorkload(SharedPrefix)
	w.Groups, w.PromptsPerGroup = 100000, 100
	f(w, "at most")
	w = DefaultWorkload(Random)
	w.OutputTokens = 0
	f(w, "output tokens")
}
