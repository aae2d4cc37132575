package pressure

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// trieCounters are the gateway's trie counters from its /metrics: resets by reason, and evictions.
type trieCounters struct {
	resets    map[string]uint64
	evictions uint64
}

// since returns c − before.
func (c trieCounters) since(before trieCounters) (map[string]uint64, uint64) {
	out := map[string]uint64{}
	for k, v := range c.resets {
		if v > before.resets[k] {
			out[k] = v - before.resets[k]
		}
	}
	if len(out) == 0 {
		out = nil
	}
	ev := uint64(0)
	if c.evictions > before.evictions {
		ev = c.evictions - before.evictions
	}
	return out, ev
}

// scrapeTrieCounters reads rolter_trie_resets_total and rolter_trie_evictions_total from the gateway at
// url. The metrics registry is process-wide, so the report takes differences over a run; a failed scrape
// gives zeros.
func scrapeTrieCounters(ctx context.Context, url string) trieCounters {
	c := trieCounters{resets: map[string]uint64{}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return c
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return c
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var name string
		switch {
		case strings.HasPrefix(line, "rolter_trie_resets_total{"):
			name = "resets"
		case strings.HasPrefix(line, "rolter_trie_evictions_total{"):
			name = "evictions"
		default:
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			continue
		}
		if name == "evictions" {
			c.evictions += uint64(v)
			continue
		}
		reason := "?"
		if _, after, ok := strings.Cut(line, `reason="`); ok {
			reason, _, _ = strings.Cut(after, `"`)
		}
		c.resets[reason] += uint64(v)
	}
	return c
}
