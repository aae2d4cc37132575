//go:build !race

package trie

import "testing"

func TestMatchAllocs(t *testing.T) {
	c := newCorpus(1)
	tr := c.warmTrie(0)
	key := c.request(8 << 10)
	if got := testing.AllocsPerRun(100, func() { sinkInt += tr.Match(key) }); got != 0 {
		t.Fatalf("Match allocates %v times per call; want 0", got)
	}
}

func TestMatchEachAllocs(t *testing.T) {
	c := newCorpus(1)
	ts := []*Trie{c.warmTrie(0), nil, c.warmTrie(1), c.warmTrie(2)}
	key := c.request(8 << 10)
	ms := make([]int, len(ts))
	if got := testing.AllocsPerRun(100, func() { MatchEach(ts, key, ms) }); got != 0 {
		t.Fatalf("MatchEach allocates %v times per call; want 0", got)
	}
}

func TestInsertPresentAllocs(t *testing.T) {
	c := newCorpus(2)
	tr := c.warmTrie(0)
	key := c.conversation(0, 8<<10)
	tr.Insert(key)
	if got := testing.AllocsPerRun(100, func() { tr.Insert(key) }); got != 0 {
		t.Fatalf("Insert of a stored prompt allocates %v times per call; want 0", got)
	}
}
