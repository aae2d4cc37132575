package trie

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// words returns a generator of random words of n bytes over a 3-letter alphabet, which makes shared prefixes
// and branching nodes common.
func words(rng *rand.Rand) func(n int) []byte {
	return func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + rng.IntN(3))
		}
		return b
	}
}

func mustInvariants(t *testing.T, tr *Trie) {
	t.Helper()
	if err := tr.checkInvariants(); err != nil {
		t.Fatalf("invariant: %s", err)
	}
}

// MatchEach gives every trie's Match: tries of different contents, over more tries than it walks at once,
// with nil tries, and keys that end at a node, inside an edge, past every prompt or at once.
func TestMatchEach(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	word := words(rng)
	var prompts [][]byte
	for range 60 {
		prompts = append(prompts, word(1+rng.IntN(40)))
	}
	ts := make([]*Trie, 11)
	for i := range ts {
		if i%5 == 3 {
			continue // nil
		}
		ts[i] = New(8 + 4*i)
		for range 10 + 5*i {
			ts[i].Insert(prompts[rng.IntN(len(prompts))])
		}
	}
	ms := make([]int, len(ts))
	for n := range 2000 {
		key := word(rng.IntN(50))
		if n%2 == 0 {
			p := prompts[rng.IntN(len(prompts))]
			key = append(slices.Clip(p[:rng.IntN(len(p)+1)]), key...)
		}
		for _, k := range []int{len(ts), 1, 2, 9} {
			MatchEach(ts[:k], key, ms[:k])
			for i, tr := range ts[:k] {
				want := 0
				if tr != nil {
					want = tr.Match(key)
				}
				if ms[i] != want {
					t.Fatalf("MatchEach(%q) over %d tries: trie %d matched %d; Match gives %d", key, k, i, ms[i], want)
				}
			}
		}
	}
}

func TestMatch(t *testing.T) {
	tr := New(0)
	tr.Insert([]byte("hello world"))
	tr.Insert([]byte("help me"))
	tr.Insert([]byte("hello"))
	mustInvariants(t, tr)

	f := func(key string, want int) {
		t.Helper()
		if got := tr.Match([]byte(key)); got != want {
			t.Fatalf("Match(%q) = %d; want %d", key, got, want)
		}
	}
	f("", 0)
	f("x", 0)
	f("h", 1)
	f("hel", 3)
	f("help", 4)        // ends inside the edge "p me"
	f("helq", 3)        // leaves at a branching node
	f("hello there", 6) // "hello" is a prompt, " world" an edge below it
	f("hello", 5)
	f("hello world", 11)
	f("hello world and more", 11)
	f("hello wo", 8) // ends inside an edge
	f("hello wx", 7) // leaves inside an edge
}

func TestEmptyKey(t *testing.T) {
	tr := New(4)
	tr.Insert(nil)
	tr.Insert([]byte{})
	if st := tr.Stats(); st != (Stats{ArenaBytes: st.ArenaBytes}) {
		t.Fatalf("empty inserts changed the trie: %+v", st)
	}
	if got := tr.Match(nil); got != 0 {
		t.Fatalf("Match(nil) = %d", got)
	}
}

func TestKeyIsCopied(t *testing.T) {
	tr := New(0)
	key := []byte("system: be brief")
	tr.Insert(key)
	copy(key, "XXXXXX")
	if got := tr.Match([]byte("system: be brief")); got != 16 {
		t.Fatalf("Match after the caller reused its buffer = %d; want 16", got)
	}
}

func TestPrefixPromptIsDistinct(t *testing.T) {
	tr := New(2)
	tr.Insert([]byte("abc"))
	tr.Insert([]byte("abcdef"))
	if st := tr.Stats(); st.Prompts != 2 || st.Nodes != 2 || st.EdgeBytes != 6 {
		t.Fatalf("stats %+v; want 2 prompts, 2 nodes, 6 edge bytes", st)
	}
	// A third prompt needs a node: "abc" goes, "abcdef" still covers it.
	tr.Insert([]byte("x"))
	mustInvariants(t, tr)
	if got, want := tr.keptPrompts(), []string{"abcdef", "x"}; !slices.Equal(got, want) {
		t.Fatalf("kept %q; want %q", got, want)
	}
	if got := tr.Match([]byte("abc")); got != 3 {
		t.Fatalf("Match(abc) = %d; want 3", got)
	}
}

// A system prompt shared by two conversations survives the eviction of the
// older conversation that extended it.
func TestSharedSystemPromptSurvivesEviction(t *testing.T) {
	sys := "system\x00" + strings.Repeat("You are a helpful assistant. ", 40) + "\x01"
	a1 := sys + "user\x00Tell me about cats\x01"
	a2 := a1 + "assistant\x00Cats are small felines.\x01user\x00And lions?\x01"
	b1 := sys + "user\x00Plan a trip to Rome\x01"
	b2 := b1 + "assistant\x00Day one: the Colosseum.\x01user\x00Day two?\x01"
	c1 := sys + "user\x00Write a haiku\x01"

	tr := New(4)
	for _, p := range []string{a1, a2, b1} {
		tr.Insert([]byte(p))
	}
	// sys (branching), a1 (prompt), a2 (leaf), b1 (leaf).
	if n := tr.Nodes(); n != 4 {
		t.Fatalf("Nodes = %d; want 4", n)
	}
	tr.Insert([]byte(b2)) // evicts a1: its node merges into a2's
	tr.Insert([]byte(c1)) // evicts a2: its leaf goes, sys still branches
	mustInvariants(t, tr)
	if got, want := tr.keptPrompts(), []string{b1, b2, c1}; !slices.Equal(got, want) {
		t.Fatalf("kept %q; want %q", got, want)
	}
	if st := tr.Stats(); st.Nodes != 4 || st.Evictions != 2 {
		t.Fatalf("stats %+v; want 4 nodes, 2 evictions", st)
	}
	f := func(key string, want int) {
		t.Helper()
		if got := tr.Match([]byte(key)); got != want {
			t.Fatalf("Match(%.40q...) = %d; want %d", key, got, want)
		}
	}
	f(a2, len(sys+"user\x00")) // the old conversation is gone, the system prompt is not
	f(b2+"assistant\x00", len(b2))
	f(sys+"user\x00Write a poem", len(sys+"user\x00Write a "))
}

func TestReinsertRefreshesRecency(t *testing.T) {
	tr := New(2)
	tr.Insert([]byte("alpha"))
	tr.Insert([]byte("bravo"))
	tr.Insert([]byte("alpha")) // now the most recent
	if st := tr.Stats(); st.Nodes != 2 || st.Prompts != 2 {
		t.Fatalf("re-insert changed the shape: %+v", st)
	}
	tr.Insert([]byte("charlie"))
	mustInvariants(t, tr)
	if got, want := tr.keptPrompts(), []string{"alpha", "charlie"}; !slices.Equal(got, want) {
		t.Fatalf("kept %q; want %q", got, want)
	}
	if tr.Match([]byte("bravo")) != 0 || tr.Match([]byte("alpha")) != 5 {
		t.Fatalf("bravo should be evicted and alpha kept")
	}
}

func TestReset(t *testing.T) {
	tr := New(2)
	for _, p := range []string{"one", "two", "three"} {
		tr.Insert([]byte(p))
	}
	tr.Reset()
	mustInvariants(t, tr)
	st := tr.Stats()
	if st.Nodes != 0 || st.Prompts != 0 || st.EdgeBytes != 0 || tr.Nodes() != 0 {
		t.Fatalf("stats after Reset %+v", st)
	}
	if st.Evictions != 2 { // "three" shares a byte with "two": it needs 2 nodes
		t.Fatalf("Evictions = %d after Reset; want the cumulative 2", st.Evictions)
	}
	if got := tr.Match([]byte("three")); got != 0 {
		t.Fatalf("Match after Reset = %d", got)
	}
	tr.Insert([]byte("four"))
	mustInvariants(t, tr)
	if got := tr.Match([]byte("four")); got != 4 {
		t.Fatalf("Match after Reset and Insert = %d", got)
	}
}

// With one node every new prompt replaces the previous one.
func TestCeilingOfOneNode(t *testing.T) {
	tr := New(1)
	for i := range 100 {
		tr.Insert([]byte{'p', byte(i)})
		mustInvariants(t, tr)
	}
	if got, want := tr.keptPrompts(), []string{"p\x63"}; !slices.Equal(got, want) {
		t.Fatalf("kept %q; want %q", got, want)
	}
	if st := tr.Stats(); st.Evictions != 99 {
		t.Fatalf("Evictions = %d; want 99", st.Evictions)
	}
}

func TestLargePrompts(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	tr := New(8)
	tr.Insert(big)
	turn := append(slices.Clip(big), bytes.Repeat([]byte("next turn "), 100)...)
	tr.Insert(turn)
	other := slices.Clone(big)
	other[3<<20] ^= 0xff // diverges 3 MiB in
	tr.Insert(other)
	mustInvariants(t, tr)
	f := func(key []byte, want int) {
		t.Helper()
		if got := tr.Match(key); got != want {
			t.Fatalf("Match(%d bytes) = %d; want %d", len(key), got, want)
		}
	}
	f(big, len(big))
	f(turn, len(turn))
	f(other, len(other))
	f(append(slices.Clip(big[:3<<20]), 0x5a), 3<<20)

	// A byte ceiling below one prompt stores the prompt's first bytes.
	lim := NewLimited(8, 1<<20)
	lim.Insert(big)
	lim.Insert(big)
	mustInvariants(t, lim)
	if st := lim.Stats(); st.EdgeBytes != 1<<20 || st.Prompts != 1 {
		t.Fatalf("stats %+v; want one 1 MiB prompt", st)
	}
	if got := lim.Match(big); got != 1<<20 {
		t.Fatalf("Match on a cut prompt = %d; want %d", got, 1<<20)
	}
	lim.Insert(other) // the same first MiB: already stored
	if st := lim.Stats(); st.Prompts != 1 || st.Evictions != 0 {
		t.Fatalf("stats %+v; want the cut prompt refreshed", st)
	}
}

// Freed node slots and arena bytes are reused: churn through a small ceiling
// does not grow memory.
func TestMemoryBoundedUnderChurn(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	sys := bytes.Repeat([]byte("shared system prompt "), 50)
	tr := New(64)
	insert := func(n int) {
		for range n {
			key := append(slices.Clip(sys[:rng.IntN(len(sys))]), make([]byte, 1+rng.IntN(300))...)
			for i := len(key) - 1; i >= 0 && key[i] == 0; i-- {
				key[i] = byte('a' + rng.IntN(26))
			}
			tr.Insert(key)
		}
	}
	insert(2000)
	mustInvariants(t, tr)
	s := tr.st.Load()
	slots, arena := s.nodes.next, len(s.bytes.buf)
	insert(20000)
	mustInvariants(t, tr)
	s = tr.st.Load()
	if s.nodes.next > slots+8 || len(s.bytes.buf) > 2*arena {
		t.Fatalf("memory grew under churn: node slots %d -> %d, arena %d -> %d",
			slots, s.nodes.next, arena, len(s.bytes.buf))
	}
	if st := tr.Stats(); st.Nodes > 64 || st.Evictions == 0 {
		t.Fatalf("stats %+v", st)
	}
}

// The merge of a node with its only child copies the fewest bytes it can;
// whichever way it goes, the arena stays exactly accounted for and the kept
// prompts still match whole.
func TestMergeJoinsEdges(t *testing.T) {
	f := func(prompts ...string) {
		t.Helper()
		nodes, _ := radixSize(prompts)
		tr := New(nodes)
		for _, p := range prompts {
			tr.Insert([]byte(p))
		}
		// Push them out with one-node prompts that share nothing with them.
		for i := 0; tr.Match([]byte(prompts[len(prompts)-1])) > 0; i++ {
			tr.Insert([]byte{0xf0 + byte(i)})
			mustInvariants(t, tr)
			for _, p := range tr.keptPrompts() {
				if got := tr.Match([]byte(p)); got != len(p) {
					t.Fatalf("kept %q but Match = %d", p, got)
				}
			}
		}
	}
	f("abcdef", "abcxyz")                // split then merge back: adjacent bytes
	f("abc", "abcdef", "abcxyz")         // terminal with one child, then branch
	f("abcxyz", "abc", "abcdef")         // merge of bytes from different inserts
	f("ab", "abcd", "abef", "abcdgh")    // several levels
	f("x", "xy", "xyz", "xyzw", "xyzwv") // a chain of prompts
}

// TestSetLimits: lowering the ceilings of a trie in use prunes its oldest prompts at once, keeps the newest,
// and later inserts obey the new ceilings.
func TestSetLimits(t *testing.T) {
	tr := NewLimited(1000, 0)
	keys := []string{"alpha one", "bravo two", "charlie three", "delta four"}
	for _, k := range keys {
		tr.Insert([]byte(k))
	}
	tr.SetLimits(1000, 24)
	if n, b := tr.Limits(); n != 1000 || b != 24 {
		t.Fatalf("limits %d, %d", n, b)
	}
	st := tr.Stats()
	if st.EdgeBytes > 24 || st.Evictions == 0 {
		t.Fatalf("after SetLimits: %+v", st)
	}
	if got := tr.Match([]byte("delta four")); got != len("delta four") {
		t.Fatalf("the newest prompt was pruned: match %d", got)
	}
	if got := tr.Match([]byte("alpha one")); got == len("alpha one") {
		t.Fatal("the oldest prompt survived")
	}
	tr.Insert([]byte("echo five and a long tail"))
	if st := tr.Stats(); st.EdgeBytes > 24 {
		t.Fatalf("insert after SetLimits went over: %+v", st)
	}
}

func TestResetOwner(t *testing.T) {
	tr := New(1000)
	tr.SetOwner(7)
	tr.Insert([]byte("hello world"))
	if tr.ResetOwner(7) || tr.Match([]byte("hello world")) == 0 {
		t.Fatal("ResetOwner with the same owner emptied the trie")
	}
	if !tr.ResetOwner(8) || tr.Match([]byte("hello world")) != 0 || tr.Owner() != 8 || tr.Nodes() != 0 {
		t.Fatal("ResetOwner with a new owner kept the prompts")
	}
}
