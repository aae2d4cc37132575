package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestAppendTokensPieces(t *testing.T) {
	ids := func(pieces ...string) []uint32 {
		var out []uint32
		for _, p := range pieces {
			out = append(out, pieceID([]byte(p)))
		}
		return out
	}
	f := func(text string, wantPieces ...string) {
		t.Helper()
		got := AppendTokens(nil, []byte(text))
		if want := ids(wantPieces...); !slices.Equal(got, want) {
			t.Fatalf("AppendTokens(%q) = %v, want pieces %q = %v", text, got, wantPieces, want)
		}
	}
	f("")
	f("a", "a")
	f("hello world", "hell", "o", " wor", "ld")
	f("a  b", "a", "  b")
	f("  lead", "  le", "ad")
	f("x      y", "x", "    ", "  y")
	f("end ", "end", " ")
	f("tab\tnew\nline", "tab", "\tnew", "\nlin", "e")
	for _, id := range AppendTokens(nil, []byte("some text to check the id range of")) {
		if id < firstPieceID || id >= firstPieceID+vocabSize {
			t.Fatalf("id %d outside the vocabulary", id)
		}
	}
}

// A text prefix that ends on a piece boundary tokenizes to a prefix of the text's tokens.
func TestAppendTokensPrefixStable(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("abcdefgh  \n\téü.,")
	for range 300 {
		text := make([]byte, rng.IntN(80))
		for i := range text {
			text[i] = alphabet[rng.IntN(len(alphabet))]
		}
		full := AppendTokens(nil, text)
		for cut := 0; cut <= len(text); cut++ {
			pre := AppendTokens(nil, text[:cut])
			// The prefix's pieces all end on the full text's boundaries except maybe the last.
			if len(pre) > 0 && !slices.Equal(pre[:len(pre)-1], full[:len(pre)-1]) {
				t.Fatalf("prefix %q of %q: %v vs %v", text[:cut], text, pre, full)
			}
		}
		// Cutting exactly at every boundary gives exact prefixes.
		boundaries := pieceBoundaries(text)
		for i, b := range boundaries {
			if pre := AppendTokens(nil, text[:b]); !slices.Equal(pre, full[:i+1]) {
				t.Fatalf("boundary prefix %q of %q: %v vs %v", text[:b], text, pre, full[:i+1])
			}
		}
	}
}

// pieceBoundaries returns the end offsets of the pieces of text (a reference implementation).
func pieceBoundaries(text []byte) []int {
	var out []int
	i := 0
	for i < len(text) {
		start, word := i, false
		for i < len(text) && i-start < 4 && !(word && isSpace(text[i])) {
			if !isSpace(text[i]) {
				word = true
			}
			i++
		}
		out = append(out, i)
	}
	return out
}

func TestAppendTokensRatio(t *testing.T) {
	text := []byte(words("The", 2000))
	n := len(AppendTokens(nil, text))
	perToken := float64(len(text)) / float64(n)
	if perToken < 2.5 || perToken > 5 {
		t.Fatalf("%.2f bytes per token, want roughly 3-4", perToken)
	}
}

func TestAppendChatTokensTurnsArePrefixes(t *testing.T) {
	msg := func(role, content string) [2][]byte { return [2][]byte{[]byte(role), []byte(content)} }
	turn1 := [][2][]byte{msg("system", "you are terse"), msg("user", "what is a kv cache?")}
	turn2 := append(slices.Clone(turn1), msg("assistant", "a cache of keys and values"), msg("user", "and prefix caching?"))
	t1 := AppendChatTokens(nil, turn1, true)
	t2 := AppendChatTokens(nil, turn2, true)
	if len(t2) <= len(t1) || !slices.Equal(t2[:len(t1)], t1) {
		t.Fatalf("turn 1 %v is not a prefix of turn 2 %v", t1, t2)
	}
	noGen := AppendChatTokens(nil, turn1, false)
	if !slices.Equal(t1[:len(noGen)], noGen) || len(t1)-len(noGen) != len(appendGenerationPrompt(nil)) {
		t.Fatalf("generation prompt: %v vs %v", t1, noGen)
	}
	// Roles matter: the same content under another role tokenizes differently.
	other := AppendChatTokens(nil, [][2][]byte{msg("system", "you are terse"), msg("assistant", "what is a kv cache?")}, true)
	if slices.Equal(other, t1) {
		t.Fatalf("role is not part of the tokens")
	}
	if fmt.Sprint(AppendChatTokens(nil, turn1, true)) != fmt.Sprint(t1) {
		t.Fatalf("not deterministic")
	}
}
