package routing

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// palette is Tableau 10: distinguishable, and readable in grey.
var palette = []color.Color{
	color.RGBA{0x4e, 0x79, 0xa7, 0xff}, color.RGBA{0xf2, 0x8e, 0x2b, 0xff}, color.RGBA{0xe1, 0x57, 0x59, 0xff},
	color.RGBA{0x76, 0xb7, 0xb2, 0xff}, color.RGBA{0x59, 0xa1, 0x4f, 0xff}, color.RGBA{0xed, 0xc9, 0x48, 0xff},
	color.RGBA{0xb0, 0x7a, 0xa1, 0xff}, color.RGBA{0xff, 0x9d, 0xa7, 0xff}, color.RGBA{0x9c, 0x75, 0x5f, 0xff},
	color.RGBA{0xba, 0xb0, 0xac, 0xff},
}

// barChart describes a grouped bar chart: values[s][g] is series s in group g.
type barChart struct {
	title, yLabel string
	groups        []string
	series        []string
	values        [][]float64
	// marks, when set, draws a black line across each group at marks[g] (e.g. the oracle),
	// labelled markLabel in the legend; a mark < 0 is not drawn.
	marks     []float64
	markLabel string
}

// save renders c into dir/file as PNG.
func (c *barChart) save(dir, file string) error {
	p := plot.New()
	p.Title.Text = c.title
	p.Y.Label.Text = c.yLabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = false
	n := len(c.series)
	width := vg.Points(float64(min(16, 440/max(1, n*len(c.groups)))))
	for s, name := range c.series {
		bars, err := plotter.NewBarChart(plotter.Values(c.values[s]), width)
		if err != nil {
			return fmt.Errorf("cannot draw %s: %w", file, err)
		}
		bars.Color = palette[s%len(palette)]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(s)-float64(n-1)/2) * width
		p.Add(bars)
		p.Legend.Add(name, bars)
	}
	if c.marks != nil {
		half := 0.42
		labelled := false
		for g, m := range c.marks {
			if m < 0 {
				continue
			}
			l, err := plotter.NewLine(plotter.XYs{{X: float64(g) - half, Y: m}, {X: float64(g) + half, Y: m}})
			if err != nil {
				return fmt.Errorf("cannot draw %s: %w", file, err)
			}
			l.LineStyle = draw.LineStyle{Color: color.Black, Width: vg.Points(2), Dashes: []vg.Length{vg.Points(5), vg.Points(3)}}
			p.Add(l)
			if !labelled {
				p.Legend.Add(c.markLabel, l)
				labelled = true
			}
		}
	}
	p.NominalX(c.groups...)
	maxY := 0.0
	for _, vs := range c.values {
		for _, v := range vs {
			maxY = max(maxY, v)
		}
	}
	for _, m := range c.marks {
		maxY = max(maxY, m)
	}
	if maxY == 0 {
		maxY = 1
	}
	// Leave room above the bars for the legend (one line per series, about 5% of the height each).
	entries := len(c.series)
	if c.marks != nil {
		entries++
	}
	p.Y.Max = maxY / max(0.35, 1-0.055*float64(entries)-0.05)
	p.X.Min, p.X.Max = -0.5, float64(len(c.groups))-0.5
	if err := p.Save(10*vg.Inch, 4.5*vg.Inch, filepath.Join(dir, file)); err != nil {
		return fmt.Errorf("cannot save %s: %w", file, err)
	}
	return nil
}

// drawCharts draws the routing report's charts into dir and returns their file names.
func drawCharts(rep *Report, dir string) ([]string, error) {
	o := rep.Options
	var labels []string
	for _, s := range o.Strategies {
		labels = append(labels, rep.chartLabel(s))
	}
	charts := []struct {
		file string
		c    barChart
	}{
		{"routing-hit-rate.png", barChart{title: "Token hit rate (cached / prompt tokens)", yLabel: "token hit rate",
			groups: o.Scenarios, series: labels, values: rep.perScenario(func(r *Trial) float64 { return r.Result.HitRate }),
			marks: rep.oracles(), markLabel: "oracle bound"}},
		{"routing-ttft-p50.png", barChart{title: "TTFT p50 (first body byte)", yLabel: "ms",
			groups: o.Scenarios, series: labels, values: rep.perScenario(func(r *Trial) float64 { return r.Result.TTFT.P50 })}},
		{"routing-ttft-p99.png", barChart{title: "TTFT p99 (first body byte)", yLabel: "ms",
			groups: o.Scenarios, series: labels, values: rep.perScenario(func(r *Trial) float64 { return r.Result.TTFT.P99 })}},
		{"routing-throughput.png", barChart{title: "Throughput (closed loop)", yLabel: "requests / s",
			groups: o.Scenarios, series: labels, values: rep.perScenario(func(r *Trial) float64 { return r.Result.Throughput })}},
	}
	var files []string
	for _, ch := range charts {
		if err := ch.c.save(dir, ch.file); err != nil {
			return nil, err
		}
		files = append(files, ch.file)
	}
	// Per-engine views: requests per engine on shared-prefix, mean in flight on hot-prefix.
	perEngine := []struct {
		scenario, file, title, yLabel string
		f                             func(*Trial) []float64
	}{
		{"shared-prefix", "routing-share-shared-prefix.png", "shared-prefix: requests per engine", "requests", requestsPerEngine},
		{"hot-prefix", "routing-inflight-hot-prefix.png", "hot-prefix: mean requests in flight per engine", "running + waiting",
			func(r *Trial) []float64 { return r.Inflight.Mean }},
	}
	for _, ch := range perEngine {
		c, ok := rep.perEngine(ch.scenario, ch.title, ch.yLabel, ch.f)
		if !ok {
			continue
		}
		if err := c.save(dir, ch.file); err != nil {
			return nil, err
		}
		files = append(files, ch.file)
	}
	return files, nil
}

// chartLabel is strategy s in a chart's legend, marked "(n/a)" when none of its runs measured anything.
func (rep *Report) chartLabel(s string) string {
	for _, run := range rep.Runs {
		if run.Strategy == s && run.Available() {
			return s
		}
	}
	return s + " (n/a)"
}

// perScenario returns f of each strategy's representative run in each scenario (0 where it measured
// nothing): values[strategy][scenario].
func (rep *Report) perScenario(f func(*Trial) float64) [][]float64 {
	o := rep.Options
	vs := make([][]float64, len(o.Strategies))
	for i, s := range o.Strategies {
		vs[i] = make([]float64, len(o.Scenarios))
		for j, sc := range o.Scenarios {
			if run := rep.Run(sc, s); run != nil && run.Available() {
				vs[i][j] = f(run)
			}
		}
	}
	return vs
}

// oracles returns each scenario's oracle bound, -1 where no run measured it.
func (rep *Report) oracles() []float64 {
	oracle := make([]float64, len(rep.Options.Scenarios))
	for j, sc := range rep.Options.Scenarios {
		oracle[j] = -1
		for _, run := range rep.Runs {
			if run.Scenario == sc && run.Available() {
				oracle[j] = run.Result.OracleHitRate
				break
			}
		}
	}
	return oracle
}

// perEngine is the chart of f (a value per engine) of each strategy's representative run on scenario: a
// group per strategy that measured something, a series per engine; false when none did.
func (rep *Report) perEngine(scenario, title, yLabel string, f func(*Trial) []float64) (barChart, bool) {
	var groups []string
	var rows [][]float64
	for _, s := range rep.Options.Strategies {
		if run := rep.Run(scenario, s); run != nil && run.Available() {
			groups = append(groups, s)
			rows = append(rows, f(run))
		}
	}
	if len(groups) == 0 {
		return barChart{}, false
	}
	series := make([]string, rep.Options.Engines)
	values := make([][]float64, rep.Options.Engines)
	for e := range series {
		series[e] = fmt.Sprintf("sim-%d", e+1)
		values[e] = make([]float64, len(groups))
		for g := range groups {
			if e < len(rows[g]) {
				values[e][g] = rows[g][e]
			}
		}
	}
	return barChart{title: title, yLabel: yLabel, groups: groups, series: series, values: values}, true
}

// requestsPerEngine is the requests each engine got in a run.
func requestsPerEngine(r *Trial) []float64 {
	v := make([]float64, len(r.Result.Targets))
	for i, t := range r.Result.Targets {
		v[i] = float64(t.Requests)
	}
	return v
}
