package trie

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// model is the naive reference: whole prompts in LRU order, brute-force
// longest prefix, and the eviction rule restated on whole prompts.
type model struct {
	maxNodes int
	maxBytes int
	order    []string // least recently inserted first
}

func newModel(maxNodes, maxBytes int) *model {
	if maxNodes <= 0 {
		maxNodes = DefaultMaxNodes
	}
	return &model{maxNodes: maxNodes, maxBytes: max(maxBytes, 0)}
}

func (m *model) insert(key string) {
	if key == "" {
		return
	}
	if m.maxBytes > 0 && len(key) > m.maxBytes {
		key = key[:m.maxBytes]
	}
	if i := slices.Index(m.order, key); i >= 0 {
		m.order = append(slices.Delete(m.order, i, i+1), key)
		return
	}
	for len(m.order) > 0 {
		nodes, bytes := radixSize(append(slices.Clone(m.order), key))
		if nodes <= m.maxNodes && (m.maxBytes == 0 || bytes <= m.maxBytes) {
			break
		}
		m.order = m.order[1:]
	}
	m.order = append(m.order, key)
}

func (m *model) match(key string) int {
	best := 0
	for _, p := range m.order {
		best = max(best, commonPrefix([]byte(p), []byte(key)))
	}
	return best
}

// radixSize returns the nodes and edge bytes of the smallest radix tree
// holding prompts (the root not counted). In sorted order, every node that
// is not a prompt is where two neighbours part, and each prompt adds the
// bytes it does not share with its predecessor.
func radixSize(prompts []string) (nodes, bytes int) {
	sorted := slices.Compact(slices.Sorted(slices.Values(prompts)))
	branches := map[string]bool{}
	for i, p := range sorted {
		shared := 0
		if i > 0 {
			prev := sorted[i-1]
			shared = commonPrefix([]byte(prev), []byte(p))
			if shared > 0 && shared < len(prev) && !slices.Contains(sorted, p[:shared]) {
				branches[p[:shared]] = true
			}
		}
		bytes += len(p) - shared
	}
	return len(sorted) + len(branches), bytes
}

// radixSizeNaive is radixSize straight from the definition: a node for every
// non-empty prefix that is a prompt or is followed by two or more distinct
// bytes; edge bytes are the distinct non-empty prefixes.
func radixSizeNaive(prompts []string) (nodes, bytes int) {
	next := map[string]map[byte]bool{}
	for _, p := range prompts {
		for i := 1; i <= len(p); i++ {
			if next[p[:i]] == nil {
				next[p[:i]] = map[byte]bool{}
			}
			if i < len(p) {
				next[p[:i]][p[i]] = true
			}
		}
	}
	isPrompt := map[string]bool{}
	for _, p := range prompts {
		isPrompt[p] = true
	}
	for prefix, nb := range next {
		if isPrompt[prefix] || len(nb) >= 2 {
			nodes++
		}
	}
	return nodes, len(next)
}

func TestRadixSize(t *testing.T) {
	f := func(prompts []string, nodes, bytes int) {
		t.Helper()
		n, b := radixSize(prompts)
		if n != nodes || b != bytes {
			t.Fatalf("radixSize(%q) = %d nodes %d bytes; want %d %d", prompts, n, b, nodes, bytes)
		}
	}
	f(nil, 0, 0)
	f([]string{"abc"}, 1, 3)
	f([]string{"abc", "abd"}, 3, 4)
	f([]string{"ab", "abc"}, 2, 3)
	f([]string{"ab", "abc", "abd"}, 3, 4)
	f([]string{"a", "b"}, 2, 2)
	f([]string{"abc", "abd", "x"}, 4, 5)
	f([]string{"abc", "abc"}, 1, 3)

	rng := rand.New(rand.NewPCG(1, 1))
	for range 2000 {
		var prompts []string
		for range rng.IntN(8) {
			b := make([]byte, 1+rng.IntN(6))
			for i := range b {
				b[i] = 'a' + byte(rng.IntN(2))
			}
			prompts = append(prompts, string(b))
		}
		n, b := radixSizeNaive(prompts)
		f(prompts, n, b)
	}
}

// runModel drives a trie and the model with the same random operations and
// fails at the first disagreement.
func runModel(t *testing.T, rng *rand.Rand, maxNodes, maxBytes, alphabet, maxLen, ops int) {
	t.Helper()
	tr := NewLimited(maxNodes, maxBytes)
	m := newModel(maxNodes, maxBytes)
	var history []string
	key := func() string {
		// Often extend or cut an earlier key, so that prefixes collide.
		var b []byte
		if len(history) > 0 && rng.IntN(2) == 0 {
			b = []byte(history[rng.IntN(len(history))])
			b = b[:rng.IntN(len(b)+1)]
		}
		for n := rng.IntN(maxLen + 1 - min(len(b), maxLen)); n > 0; n-- {
			b = append(b, byte('a'+rng.IntN(alphabet)))
		}
		return string(b)
	}
	var log []string
	fail := func(format string, args ...any) {
		t.Helper()
		tail := log[max(0, len(log)-20):]
		t.Fatalf("maxNodes=%d maxBytes=%d, after ops (last %d):\n%s\n%s", maxNodes, maxBytes, len(tail),
			strings.Join(tail, "\n"), fmt.Sprintf(format, args...))
	}
	for range ops {
		k := key()
		if rng.IntN(3) > 0 {
			log = append(log, fmt.Sprintf("insert %q", k))
			tr.Insert([]byte(k))
			m.insert(k)
			history = append(history, k)
			if err := tr.checkInvariants(); err != nil {
				fail("invariant: %s", err)
			}
			if got := tr.keptPrompts(); !slices.Equal(got, m.order) {
				fail("kept prompts %q, model %q", got, m.order)
			}
			n, b := radixSize(m.order)
			if st := tr.Stats(); st.Nodes != n || st.EdgeBytes != b || st.Prompts != len(m.order) {
				fail("stats %+v, model nodes=%d bytes=%d prompts=%d", st, n, b, len(m.order))
			}
		} else {
			log = append(log, fmt.Sprintf("match %q", k))
		}
		if got, want := tr.Match([]byte(k)), m.match(k); got != want {
			fail("Match(%q) = %d, model %d", k, got, want)
		}
	}
}

func TestModelRandom(t *testing.T) {
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, 1))
		maxNodes := 1 + rng.IntN(12)
		maxBytes := 0
		if seed%3 == 0 {
			maxBytes = 1 + rng.IntN(30)
		}
		alphabet := 2 + rng.IntN(3)
		runModel(t, rng, maxNodes, maxBytes, alphabet, 10, 300)
	}
}

func TestModelLarger(t *testing.T) {
	runModel(t, rand.New(rand.NewPCG(7, 7)), 200, 0, 4, 40, 4000)
	runModel(t, rand.New(rand.NewPCG(8, 8)), 100, 600, 2, 60, 4000)
}
