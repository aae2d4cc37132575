package pressure

import "github.com/rolter-ai/rolter/loadtest"

// ClaimStats compare, over the requests a cache strategy sent to a holder (decision prefix_hit), the
// predicted prefix-match fraction (x-rolter-prefix-match: prompt-key bytes for the trie strategies, blocks
// for precise_cache_aware) with the delivered one (cached / prompt tokens).
type ClaimStats struct {
	PrefixHits int     `json:"prefix_hits"`
	Predicted  float64 `json:"predicted"` // mean over them
	Delivered  float64 `json:"delivered"` // mean over them
	// Stale counts the prefix hits that got less than half the predicted reuse: the trie claimed a prefix
	// the engine no longer held (evicted, or not yet cached by a request still in prefill).
	Stale int `json:"stale"`
	// Missed counts the prefix hits that got no cached token at all.
	Missed int `json:"missed"`
}

// claimStats compares the predicted and delivered reuse of the prefix_hit decisions.
func claimStats(samples []loadtest.Sample) ClaimStats {
	var c ClaimStats
	var pred, del float64
	for i := range samples {
		s := &samples[i]
		if s.Decision != "prefix_hit" || s.PrefixMatch < 0 || s.Error != "" || s.PromptTokens == 0 {
			continue
		}
		d := float64(s.CachedTokens) / float64(s.PromptTokens)
		c.PrefixHits++
		pred += s.PrefixMatch
		del += d
		if d < 0.5*s.PrefixMatch {
			c.Stale++
		}
		if s.CachedTokens == 0 {
			c.Missed++
		}
	}
	if c.PrefixHits > 0 {
		c.Predicted, c.Delivered = pred/float64(c.PrefixHits), del/float64(c.PrefixHits)
	}
	return c
}
