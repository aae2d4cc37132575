package trie

import (
	"slices"
	"testing"
)

// FuzzTrie decodes data into a ceiling and a sequence of inserts and matches
// over a tiny alphabet, and checks the trie against the model after each.
//
//	go test -run '^$' -fuzz FuzzTrie -fuzztime 30s ./trie/
func FuzzTrie(f *testing.F) {
	f.Add([]byte{3, 0, 0, 8, 1, 2, 3, 4, 10, 1, 2, 3, 4, 5, 6, 7})
	f.Add([]byte{1, 200, 1, 12, 0, 1, 1, 0, 0, 1, 6, 1, 1, 1, 7, 0, 0})
	f.Add([]byte{0, 0, 2, 20, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 2, 23, 2, 1, 0, 4, 8, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		maxNodes := 1 + int(data[0]%16)
		maxBytes := 0
		if data[1] >= 128 {
			maxBytes = 1 + int(data[1]%64)
		}
		alphabet := 2 + data[2]%4
		data = data[3:]

		tr := NewLimited(maxNodes, maxBytes)
		m := newModel(maxNodes, maxBytes)
		var last []byte
		for len(data) > 0 {
			op := data[0]
			data = data[1:]
			n := min(int(op>>2)%24, len(data))
			var key []byte
			if op&2 != 0 && len(last) > 0 {
				// Extend a prefix of the previous key: shared prefixes.
				key = append(key, last[:int(op>>3)%(len(last)+1)]...)
			}
			for _, b := range data[:n] {
				key = append(key, 'a'+b%alphabet)
			}
			data = data[n:]
			if op&1 == 0 {
				tr.Insert(key)
				m.insert(string(key))
				last = key
				if err := tr.checkInvariants(); err != nil {
					t.Fatalf("invariant after Insert(%q): %s", key, err)
				}
				if got := tr.keptPrompts(); !slices.Equal(got, m.order) {
					t.Fatalf("after Insert(%q): kept %q, model %q", key, got, m.order)
				}
			}
			want := m.match(string(key))
			if got := tr.Match(key); got != want {
				t.Fatalf("Match(%q) = %d, model %d (kept %q)", key, got, want, m.order)
			}
			var ms [2]int
			if MatchEach([]*Trie{tr, nil}, key, ms[:]); ms != [2]int{want, 0} {
				t.Fatalf("MatchEach(%q) = %v, model %d (kept %q)", key, ms, want, m.order)
			}
		}
	})
}
