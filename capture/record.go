// Package capture is the routing trace: one JSON line per proxied request that records what routing
// saw and did, and nothing of what the request said ([trace] in rolter.toml; `rolter replay` reads it
// back, and also reads public traces in the Mooncake format).
//
// Privacy: a line holds lengths, counts, names the operator configured (route, target), and hashes. The
// prompt key is cut into blocks of BlockBytes bytes and each block is hashed together with the hash of
// the block before it and a salt (ChainHash): two requests share their first k hashes exactly when their
// prompt keys share the first k blocks, which is all a replay needs, and without the salt a hash cannot
// be checked against a guessed text. The session id is hashed with the same salt. No prompt text, no
// header value, no key is ever written.
package capture

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Record is one line of a captured trace. Fields with omitempty are absent when unknown: In, Out and
// Cached come from the response's usage, which not every response carries.
type Record struct {
	// TS is the request's arrival time in Unix seconds (fractional).
	TS float64 `json:"ts"`
	// Route is the public model name of the route.
	Route string `json:"route"`
	// InBytes is the prompt key's length in bytes.
	InBytes int `json:"in_bytes"`
	// In, Out and Cached are usage.prompt_tokens, usage.completion_tokens and
	// usage.prompt_tokens_details.cached_tokens of the response, when it reported them.
	In     int  `json:"in,omitempty"`
	Out    int  `json:"out,omitempty"`
	Cached *int `json:"cached,omitempty"`
	// BlockBytes is the block size Blocks were cut at.
	BlockBytes int `json:"block_bytes"`
	// Blocks are the salted chained hashes of the prompt key's blocks (the last one may be partial), as
	// 16 hex digits each.
	Blocks []string `json:"blocks"`
	// Session is the salted hash of the request's session id, or "" when it had none.
	Session string `json:"session,omitempty"`
	// Target is the provider name the request was answered by ("" when no target answered); Decision
	// and Score are the strategy's (x-rolter-decision; Score -1 when not a cache decision).
	Target   string  `json:"target,omitempty"`
	Decision string  `json:"decision,omitempty"`
	Score    float64 `json:"score"`
	// Status is the HTTP status the client got.
	Status int `json:"status"`
}

// DefaultBlockBytes is the block size of a capture when [trace] block_bytes is not set: about 64 tokens
// of English text, fine enough that a replay sees the prefixes a 16-token-block engine reuses, coarse
// enough that a long prompt's line stays small.
const DefaultBlockBytes = 256

// ChainHash returns the hash of block given the hash of the block before it (0 for the first) and the
// capture's salt. It does not allocate (the gateway calls it for every block of every captured request).
func ChainHash(salt, prev uint64, block []byte) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], salt)
	binary.LittleEndian.PutUint64(b[8:], prev)
	var d xxhash.Digest
	d.Reset()
	_, _ = d.Write(b[:])
	_, _ = d.Write(block)
	return d.Sum64()
}
