package overhead

import (
	"math/rand/v2"
	"strconv"
)

// promptHeadLen is the length of a prompt's "request <12 digits>: " opening.
const promptHeadLen = len("request ") + 12 + len(": ")

// promptSpread is how far apart in the corpus two prompts' text may start.
const promptSpread = 64 << 10

// promptBodies renders the cache_aware case's bodies. Body seq is a chat completion whose one user
// message is size bytes: "request <seq, 12 digits>: ", then corpus text from an offset that depends on
// seq. Two bodies differ within the message's first 20 bytes, so each request is a new ~size-byte branch of
// a Rolter trie (the trie keeps inserting and, once full, evicting), and their text differs
// too, as prompts do. Safe for concurrent use.
type promptBodies struct {
	head, tail []byte
	corpus     []byte // JSON-safe text, size+promptSpread bytes
	size       int
}

func newPromptBodies(model string, size int) *promptBodies {
	words := [...]string{"the", "model", "answers", "a", "question", "about", "routing", "cache", "prefix", "tokens",
		"engine", "gateway", "request", "latency", "of", "and", "with", "every", "prompt", "user", "system",
		"context", "window", "document", "summary", "code", "function", "returns", "value", "table", "row",
		"please", "explain", "why", "this", "works", "under", "load", "on", "two", "cpus", "in", "order"}
	rng := rand.New(rand.NewPCG(19, 8192))
	text := make([]byte, 0, size+promptSpread+16)
	for len(text) < size+promptSpread {
		text = append(text, words[rng.IntN(len(words))]...)
		switch rng.IntN(12) {
		case 0:
			text = append(text, ". "...)
		case 1:
			text = append(text, ", "...)
		default:
			text = append(text, ' ')
		}
	}
	return &promptBodies{
		head:   []byte(`{"model":` + strconv.Quote(model) + `,"messages":[{"role":"user","content":"`),
		tail:   []byte(`"}],"max_tokens":8}`),
		corpus: text[:size+promptSpread],
		size:   size,
	}
}

// appendBody appends body seq to dst and returns the result; it allocates only when dst is too short.
func (g *promptBodies) appendBody(dst []byte, seq uint64) []byte {
	dst = append(dst, g.head...)
	dst = append(dst, "request "...)
	var num [12]byte
	v := seq
	for i := len(num) - 1; i >= 0; i-- {
		num[i] = byte('0' + v%10)
		v /= 10
	}
	dst = append(dst, num[:]...)
	dst = append(dst, ": "...)
	off := int(seq * 4099 % promptSpread) // 4099 is prime: consecutive prompts start far apart
	dst = append(dst, g.corpus[off:off+g.size-promptHeadLen]...)
	return append(dst, g.tail...)
}
