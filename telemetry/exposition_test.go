package telemetry

import (
	"bufio"
	"strings"
	"testing"
)

// checkExposition fails unless text is valid for strict Prometheus text parsers: at most one HELP and one
// TYPE line per family, before its samples, and all samples of a family in one group.
func checkExposition(t *testing.T, text string) {
	t.Helper()
	typed := map[string]string{}
	done := map[string]bool{}
	current := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		var fam string
		if strings.HasPrefix(line, "# ") {
			f := strings.Fields(line)
			fam = f[2]
			if f[1] == "TYPE" {
				if _, dup := typed[fam]; dup {
					t.Fatalf("second TYPE line for %s", fam)
				}
				typed[fam] = f[3]
			}
		} else {
			fam = strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if b := strings.TrimSuffix(fam, s); b != fam && (typed[b] == "histogram" || typed[b] == "summary") {
					fam = b
				}
			}
		}
		if fam != current {
			if done[fam] {
				t.Fatalf("family %s is split into more than one group", fam)
			}
			if current != "" {
				done[current] = true
			}
			current = fam
		}
	}
}

func TestRegroup(t *testing.T) {
	in := `# HELP a_total first
# TYPE a_total counter
a_total{x="1"} 1
# HELP h latency
# TYPE h histogram
h_bucket{le="1"} 1
h_sum 1
h_count 1
# HELP a_total first
# TYPE a_total counter
a_total{x="2"} 2
# TYPE h histogram
h_bucket{le="1"} 3
h_sum 3
h_count 3
g 5
`
	var b strings.Builder
	regroup(&b, []byte(in), nil)
	want := `# HELP a_total first
# TYPE a_total counter
a_total{x="1"} 1
a_total{x="2"} 2
# HELP h latency
# TYPE h histogram
h_bucket{le="1"} 1
h_sum 1
h_count 1
h_bucket{le="1"} 3
h_sum 3
h_count 3
g 5
`
	if b.String() != want {
		t.Fatalf("regroup:\n%s\nwant:\n%s", b.String(), want)
	}
	checkExposition(t, b.String())
}

// TestWritePrometheusIsStrict: the families of several sets - one per provider, as the gateway registers
// them - come out as one group each.
func TestWritePrometheusIsStrict(t *testing.T) {
	for _, target := range []string{"a", "b", "c"} {
		s := NewSet()
		s.Gauge(InflightGauge, "target="+Label(target), func() float64 { return 1 })
		s.CounterFunc(Scrapes, "target="+Label(target)+`,result="ok"`, func() uint64 { return 2 })
		m := s.NewTargetMetrics("m", target, []string{"connect"})
		m.Request(200)
		m.Duration.Update(0.1)
		s.Register()
		defer s.Unregister()
	}
	var b strings.Builder
	WritePrometheus(&b)
	checkExposition(t, b.String())
	if !strings.Contains(b.String(), `rolter_inflight_requests{target="c"} 1`) {
		t.Fatalf("missing series:\n%s", b.String())
	}
}
