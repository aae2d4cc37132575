//go:build cgo

package engine

import (
	"testing"
)

// TestPreciseFallsBackToTrie: where exact evidence is missing (here: no token ids), precise_cache_aware
// scores targets by its approximate trie instead of by load alone, so a conversation's second turn still
// lands where its prefix went.
func TestPreciseFallsBackToTrie(t *testing.T) {
	_, gw := preciseFleet(t, 3, false, nil)
	msgs := longConversation("fallback")
	first, dec := preciseTurn(t, gw, msgs, "")
	if dec != "no_token_ids" {
		t.Fatalf("first turn without ids: %s", dec)
	}
	for range 3 {
		if tg, dec := preciseTurn(t, gw, msgs, ""); tg != first || dec != "prefix_hit" {
			t.Fatalf("turn without ids went to %s (%s), want prefix_hit on %s", tg, dec, first)
		}
	}
}
