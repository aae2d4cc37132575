package fleet

import (
	"fmt"
	"strings"

	"github.com/rolter-ai/rolter/loadtest"
)

// GoalsTable writes the table of a report's goals, one row each, with measured as the header of the
// measured column; a measurement's pipes are escaped.
func GoalsTable(b *strings.Builder, measured string, goals []Goal) {
	fmt.Fprintf(b, "| goal | target | %s | verdict |\n|---|---|---|---|\n", measured)
	for _, g := range goals {
		fmt.Fprintf(b, "| %s | %s | %s | **%s** |\n", g.Name, g.Target, EscapePipes(g.Measured), g.Verdict)
	}
}

// WhyNot is the table cell of a run that measured nothing: why it was unavailable, else "failed: " and
// its error; the first line only, pipes escaped.
func WhyNot(unavailable, err string) string {
	msg := unavailable
	if msg == "" {
		msg = "failed: " + err
	}
	return EscapePipes(FirstLine(msg))
}

// WorkloadRow is one scenario of WorkloadTable: its name, its shape as a table cell, and a result that
// measured it (nil when none did: the counts are zero).
type WorkloadRow struct {
	Scenario, Shape string
	Result          *loadtest.Result
}

// WorkloadTable writes the table of the workloads a report ran: each one's requests, the distinct and
// the reused prompt blocks its oracle counted, and that working set over one engine's numBlocks.
func WorkloadTable(b *strings.Builder, numBlocks int, rows []WorkloadRow) {
	b.WriteString("| scenario | workload | requests | distinct prompt blocks | reused blocks (working set) | working set ÷ one engine's KV |\n|---|---|---:|---:|---:|---:|\n")
	for _, r := range rows {
		blocks, reused, requests := 0, 0, 0
		if r.Result != nil {
			blocks, reused, requests = r.Result.OracleBlocks, r.Result.OracleReused, r.Result.Planned
		}
		ws := 0.0
		if numBlocks > 0 {
			ws = float64(reused) / float64(numBlocks)
		}
		fmt.Fprintf(b, "| %s | %s | %d | %d | %d | %.1f |\n", r.Scenario, r.Shape, requests, blocks, reused, ws)
	}
}
