package scaleout

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/loadtest"
)

// Command reproduces the report (the Makefile target runs it after building bin/rolter).
const Command = "make bench-scaleout"

// Write writes scaleout.md and scaleout.json into dir and returns the files written.
func Write(rep *Report, dir string) ([]string, error) {
	return fleet.WriteReport(dir, "scaleout", rep.Markdown(), rep)
}

// Load reads a scaleout.json written by Write and evaluates its goals again, so the
// Markdown can be rendered anew without running anything.
func Load(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %q: %w", path, err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("cannot decode %q: %w", path, err)
	}
	rep.Goals = goalsOf(&rep)
	return &rep, nil
}

// Report is the whole scale-out report.
type Report struct {
	Options   ReportOptions                `json:"options"`
	Workloads map[string]loadtest.Workload `json:"workloads"`
	Runs      []*Trial                     `json:"runs"`
	Goals     []fleet.Goal                 `json:"goals"`
	Versions  map[string]string            `json:"versions"`
	Started   time.Time                    `json:"started"`
	Seconds   float64                      `json:"seconds"`
	Machine   fleet.Machine                `json:"machine"`
}

// ReportOptions is the serialisable part of Options.
type ReportOptions struct {
	Gateways        []int    `json:"gateways"`
	Engines         int      `json:"engines"`
	Scale           int      `json:"scale"`
	Strategies      []string `json:"strategies"`
	Scenarios       []string `json:"scenarios"`
	Concurrency     int      `json:"concurrency"`
	MaxNumSeqs      int      `json:"max_num_seqs"`
	NumBlocks       int      `json:"num_blocks"`
	BlockSize       int      `json:"block_size"`
	PrefillPerToken string   `json:"prefill_per_token"`
	DecodePerToken  string   `json:"decode_per_token"`
	Seed            uint64   `json:"seed"`
	Repeats         int      `json:"repeats"`
	RunTimeout      string   `json:"run_timeout"`
}

// Run returns the representative run of a cell: among the repeats that measured something, the one
// with the median token hit rate (the lower middle for an even count); else the first repeat (which
// says why it did not run); nil when none ran.
func (rep *Report) Run(scenario, strategy string, gateways int) *Trial {
	var first *Trial
	var ok []*Trial
	for _, run := range rep.cell(scenario, strategy, gateways) {
		if first == nil {
			first = run
		}
		if run.Available() {
			ok = append(ok, run)
		}
	}
	if len(ok) == 0 {
		return first
	}
	sort.SliceStable(ok, func(i, j int) bool { return ok[i].Result.HitRate < ok[j].Result.HitRate })
	return ok[(len(ok)-1)/2]
}

// cell returns every repeat of a cell, in run order.
func (rep *Report) cell(scenario, strategy string, gateways int) []*Trial {
	var out []*Trial
	for _, run := range rep.Runs {
		if run.Scenario == scenario && run.Strategy == strategy && run.Gateways == gateways {
			out = append(out, run)
		}
	}
	return out
}

// Median returns the median (lower middle), lowest and highest of f over the repeats of a cell that
// measured something, and their number.
func (rep *Report) Median(scenario, strategy string, gateways int, f func(*Trial) float64) (med, lo, hi float64, n int) {
	var vs []float64
	for _, run := range rep.cell(scenario, strategy, gateways) {
		if run.Available() {
			vs = append(vs, f(run))
		}
	}
	if len(vs) == 0 {
		return 0, 0, 0, 0
	}
	sort.Float64s(vs)
	return vs[(len(vs)-1)/2], vs[0], vs[len(vs)-1], len(vs)
}
