package pressure

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// Write writes <name>.md and <name>.json into dir ("pressure" when name is empty) and returns the
// files written.
func Write(rep *Report, dir, name string) ([]string, error) {
	if name == "" {
		name = "pressure"
	}
	return fleet.WriteReport(dir, name, rep.Markdown(), rep)
}

// Load reads a pressure.json written by Write and evaluates its goals again, so the Markdown
// can be rendered anew without running the fleet.
func Load(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %q: %w", path, err)
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("cannot decode %q: %w", path, err)
	}
	rep.fillRoundRobin()
	rep.Goals = goalsOf(&rep)
	return &rep, nil
}

// Report is the whole KV-pressure report.
type Report struct {
	Options   ReportOptions   `json:"options"`
	Workloads []*WorkloadInfo `json:"workloads"`
	Cells     []*Cell         `json:"cells"`
	Goals     []fleet.Goal    `json:"goals"`
	Started   time.Time       `json:"started"`
	Seconds   float64         `json:"seconds"`
	Machine   fleet.Machine   `json:"machine"`
}

// ReportOptions is the serialisable part of Options, defaults filled in.
type ReportOptions struct {
	Engines         int       `json:"engines"`
	Capacities      []float64 `json:"capacities"`
	Strategies      []string  `json:"strategies"`
	Workloads       []string  `json:"workloads"`
	Quick           bool      `json:"quick"`
	Seed            uint64    `json:"seed"`
	MaxNumSeqs      int       `json:"max_num_seqs"`
	Concurrency     int       `json:"concurrency"`
	BlockSize       int       `json:"block_size"`
	PrefillPerToken string    `json:"prefill_per_token"`
	DecodePerToken  string    `json:"decode_per_token"`
	Epsilon         float64   `json:"epsilon"`
	Recommended     string    `json:"recommended"`
}

// WorkloadInfo is one workload: its shape, its plan's working set, and the engines' KV blocks at
// each capacity.
type WorkloadInfo struct {
	Workload Workload  `json:"workload"`
	Plan     PlanStats `json:"plan"`
	// PerEngine is the working set divided over the engines: ⌈Plan.Blocks / Engines⌉.
	PerEngine int     `json:"per_engine_blocks"`
	Levels    []Level `json:"levels"`
}

// Level is one capacity of a workload.
type Level struct {
	Capacity float64 `json:"capacity"`
	// NumBlocks is each engine's KV blocks: round(Capacity × PerEngine), at least Plan.MaxRequestBlocks (the
	// engine cannot run a longer request); Raised says the minimum applied.
	NumBlocks int  `json:"num_blocks"`
	Raised    bool `json:"raised,omitempty"`
	// PlacementHitRate and PooledHitRate are the capacity-aware references over the plan's order (each cell
	// has its own over its send order). RoundRobinHitRate is the same per-engine LRU model fed in strict
	// rotation: what round robin can reach, so PlacementHitRate ÷ RoundRobinHitRate is the most any
	// placement can gain over round robin in this model.
	PlacementHitRate  float64 `json:"placement_hit_rate"`
	PooledHitRate     float64 `json:"pooled_hit_rate"`
	RoundRobinHitRate float64 `json:"round_robin_hit_rate"`
}

// level returns the level of capacity c, or nil.
func (w *WorkloadInfo) level(c float64) *Level {
	for i := range w.Levels {
		if w.Levels[i].Capacity == c {
			return &w.Levels[i]
		}
	}
	return nil
}

// availableAt returns the cells of a workload and capacity that measured something, in strategy order.
func (rep *Report) availableAt(workload string, capacity float64) []*Cell {
	var out []*Cell
	for _, s := range rep.Options.Strategies {
		if c := rep.Cell(workload, capacity, s); c != nil && c.Available() {
			out = append(out, c)
		}
	}
	return out
}

// fillRoundRobin sets every cell's VsRoundRobin.
func (rep *Report) fillRoundRobin() {
	for _, c := range rep.Cells {
		c.VsRoundRobin = 0
		if rr := rep.Cell(c.Workload, c.Capacity, "round_robin"); rr != nil && rr.Available() && c.Available() {
			c.VsRoundRobin = div(c.HitRate, rr.HitRate)
		}
	}
}

// Cell returns the cell of a workload, capacity and strategy label, or nil.
func (rep *Report) Cell(workload string, capacity float64, strategy string) *Cell {
	for _, c := range rep.Cells {
		if c.Workload == workload && c.Capacity == capacity && c.Strategy == strategy {
			return c
		}
	}
	return nil
}

// Info returns the workload info of name, or nil.
func (rep *Report) Info(name string) *WorkloadInfo {
	for _, w := range rep.Workloads {
		if w.Workload.Name == name {
			return w
		}
	}
	return nil
}
