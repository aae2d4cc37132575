package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/loadtest"
)

// WriteJSON writes the report as indented JSON.
func (rep *Report) WriteJSON(w io.Writer) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode the replay report: %w", err)
	}
	if _, err := w.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("cannot write the replay report: %w", err)
	}
	return nil
}

// Markdown renders the report: what was replayed on what, then the routing table, one row per
// strategy.
func (rep *Report) Markdown() string {
	var b strings.Builder
	o, p := rep.Options, rep.Plan
	fmt.Fprintf(&b, "## Replay of `%s`\n\n| | |\n|---|---|\n", rep.Trace)
	format := "Rolter capture"
	unit := fmt.Sprintf("%.1f tokens each, %.3f tokens per captured byte", p.BlockTokens, p.TokensPerByte)
	if rep.Format == capture.FormatMooncake {
		format = "Mooncake trace"
		unit = fmt.Sprintf("%.4g tokens each", p.BlockTokens)
	}
	fmt.Fprintf(&b, "| trace | %s: %d requests read", format, p.Read)
	if rep.Truncated {
		b.WriteString(" (the file holds more)")
	}
	fmt.Fprintf(&b, ", %d replayed", p.Planned)
	if len(p.Skipped) > 0 {
		fmt.Fprintf(&b, " (skipped: %s)", formatSkips(p.Skipped))
	}
	fmt.Fprintf(&b, "; %d distinct blocks (%s)", p.Blocks, unit)
	if rep.Format != capture.FormatMooncake {
		fmt.Fprintf(&b, "; %d sessions", p.Sessions)
		if p.Continued > 0 {
			fmt.Fprintf(&b, " (%d partial last blocks replayed as the start of the session's next block)", p.Continued)
		}
	}
	fmt.Fprintf(&b, "; %.1f s from first to last request |\n", p.SpanSeconds)
	fmt.Fprintf(&b, "| prompts | %d prompt tokens (with the chat template), %d output tokens", p.PromptTokens, p.OutputTokens)
	if o.Scale > 1 {
		fmt.Fprintf(&b, "; every token count of the trace divided by %d", o.Scale)
	}
	b.WriteString(" |\n")
	if o.Speed > 0 {
		fmt.Fprintf(&b, "| load | at the trace's arrival times ÷ %g (open loop), at most %d in flight", o.Speed, o.Concurrency)
	} else {
		fmt.Fprintf(&b, "| load | in trace order, closed loop with %d in flight", o.Concurrency)
	}
	if p.Sessions > 0 {
		b.WriteString("; a session's request waits for its previous one to end")
	}
	b.WriteString(" |\n")
	fmt.Fprintf(&b, "| fleet | %d simulated engines behind one gateway, fresh per strategy; %d KV blocks × %d tokens each, max_num_seqs %d, prefill %s per uncached token, decode %s per output token |\n",
		o.Engines, o.KVBlocks, o.BlockSize, o.MaxNumSeqs, o.PrefillPerToken, o.DecodePerToken)
	or := rep.Oracle
	if or.CapacityBlocks > 0 {
		fmt.Fprintf(&b, "| oracle | %.3f with an unlimited fleet-wide cache (no routing beats it); %.3f with one pooled LRU cache of the fleet's %d blocks; %d distinct KV blocks, %d of them reused |\n",
			or.HitRate, or.CapacityHitRate, or.CapacityBlocks, or.Blocks, or.Reused)
	}
	if p.LiveRequests > 0 {
		fmt.Fprintf(&b, "| live | %.3f: the hit rate the engines delivered in the captured run (its cached / in, %d requests) |\n",
			p.LiveHitRate, p.LiveRequests)
	}
	fmt.Fprintf(&b, "| run | %.0f s on %s |\n\n", rep.Seconds, rep.Machine)

	b.WriteString("| strategy | token hit rate | ÷ oracle | ÷ capacity oracle | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | requests per engine busiest / idlest | CoV | failed |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rep.Runs {
		if !r.Available() {
			msg := r.Unavailable
			if msg == "" {
				msg = "failed: " + r.Error
			}
			fmt.Fprintf(&b, "| %s | %s |\n", r.Strategy, fleet.EscapePipes(fleet.FirstLine(msg)))
			continue
		}
		failed := fmt.Sprint(r.Failed)
		if r.Cancelled > 0 {
			failed += fmt.Sprintf(" + %d cut off by the timeout", r.Cancelled)
		}
		if r.Sent < r.Planned {
			failed += fmt.Sprintf("; %d of %d not sent before the timeout", r.Planned-r.Sent, r.Planned)
		}
		fmt.Fprintf(&b, "| %s | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f | %s | %.3f | %s |\n", r.Strategy, r.HitRate, r.VsOracle,
			r.VsCapacityOracle, r.TTFT.P50, r.TTFT.P90, r.TTFT.P99, loadtest.FormatMaxMin(r.BusiestIdlest), r.CoV, failed)
	}
	b.WriteString("\nToken hit rate: cached / prompt tokens as the engines counted them. TTFT: first body byte, succeeded requests.\n")
	return b.String()
}

// formatSkips renders skip counts, the largest first.
func formatSkips(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d %s", m[k], k)
	}
	return strings.Join(parts, ", ")
}
