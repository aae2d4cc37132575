package loadtest

import (
	"math/rand/v2"
	"testing"
)

func seq(from, n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(from + i)
	}
	return s
}

func cat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestOracleBlocks pins the formula on hand-computed cases with 4-token blocks.
func TestOracleBlocks(t *testing.T) {
	o := NewOracle(4)
	f := func(prompt []uint32, wantHit int) {
		t.Helper()
		if got := o.AddTokens(prompt); got != wantHit {
			t.Fatalf("prompt %v: hit %d, want %d", prompt, got, wantHit)
		}
	}
	f(seq(1, 8), 0)                               // cold
	f(seq(1, 8), 4)                               // 2 full blocks cached, but the last token is computed: min(2, (8-1)/4=1) blocks
	f(seq(1, 9), 8)                               // min(2, (9-1)/4=2) blocks
	f(seq(1, 3), 0)                               // no full block
	f(cat(seq(1, 4), seq(50, 6)), 4)              // first block shared, then new
	f(cat(seq(2, 4), seq(5, 4), []uint32{99}), 0) // block 2 equals tokens 5..8 but after another first block: no hit
	f(cat(seq(1, 4), seq(50, 4), []uint32{7}), 8) // the block stored two prompts ago chains after block 1

	if b, r := o.Blocks(), o.ReusedBlocks(); b != 5 || r != 3 { // A B C D E; A B C hit later
		t.Fatalf("blocks %d reused %d, want 5, 3", b, r)
	}

	p, h := o.Totals()
	if p != 8+8+9+3+10+9+9 || h != 4+8+4+8 {
		t.Fatalf("totals %d/%d, want %d/%d", h, p, 24, 56)
	}
	if got, want := o.HitRate(), 24.0/56; got != want {
		t.Fatalf("hit rate %v, want %v", got, want)
	}
}

// TestOracleSharedPrefixFormula: for uniform shared-prefix the oracle equals
// G × (P−1) × B × ⌊C/B⌋ / (G × P × L), C = S + 8, L = S + Q + 14.
func TestOracleSharedPrefixFormula(t *testing.T) {
	f := func(groups, per, sys, q, block int) {
		t.Helper()
		w := Workload{Scenario: SharedPrefix, Seed: 5, Groups: groups, PromptsPerGroup: per, SystemTokens: sys, QuestionTokens: q, OutputTokens: 1}
		p, err := w.Generate()
		if err != nil {
			t.Fatal(err)
		}
		o := NewOracle(block)
		for _, r := range p.Requests {
			o.AddMessages(r.Messages)
		}
		c, l := sys+8, sys+q+TemplateTokens
		wantHit := int64(groups * (per - 1) * block * (c / block))
		wantPrompt := int64(groups * per * l)
		prompt, hit := o.Totals()
		if prompt != wantPrompt || hit != wantHit {
			t.Fatalf("G=%d P=%d S=%d Q=%d B=%d: oracle %d/%d, want %d/%d", groups, per, sys, q, block, hit, prompt, wantHit, wantPrompt)
		}
	}
	f(2, 3, 24, 4, 16)
	f(4, 4, 56, 8, 16)
	f(64, 16, 512, 32, 16)
	f(3, 5, 100, 10, 8)
	// With B = 4 the template header <im_start> "syst" "em" <role_end> is a block of its own that
	// every group shares: each group but the first hits it once more.
	f2 := func() {
		w := Workload{Scenario: SharedPrefix, Seed: 5, Groups: 3, PromptsPerGroup: 5, SystemTokens: 100, QuestionTokens: 10, OutputTokens: 1}
		p, _ := w.Generate()
		o := NewOracle(4)
		for _, r := range p.Requests {
			o.AddMessages(r.Messages)
		}
		if _, hit := o.Totals(); hit != 3*4*108+2*4 {
			t.Fatalf("B=4: oracle hit %d, want %d", hit, 3*4*108+2*4)
		}
	}
	f2()
}

// TestOracleMultiTurn: each round hits the full blocks of the previous round's prompt.
func TestOracleMultiTurn(t *testing.T) {
	o := NewOracle(16)
	msgs := []Message{{Role: "system", Content: words(rand.New(rand.NewPCG(1, 1)), 40, 0, 1)}}
	msgs = append(msgs, Message{Role: "user", Content: "abc"})
	if hit := o.AddMessages(msgs); hit != 0 {
		t.Fatalf("first round hit %d", hit)
	}
	first := PromptTokens(msgs)
	msgs = append(msgs, Message{Role: "assistant", Content: "the sim is"}, Message{Role: "user", Content: "def ghi"})
	if hit, want := o.AddMessages(msgs), first/16*16; hit != want {
		t.Fatalf("second round hit %d, want %d (full blocks of the first prompt)", hit, want)
	}
}
