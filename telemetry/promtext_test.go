package telemetry

import (
	"bytes"
	"math"
	"os"
	"strings"
	"testing"
)

// tv9 is test vector TV9, vLLM's metrics as python prometheus_client prints them (docs/internals/test-vectors.md).
const tv9 = `# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-0.6B"} 0.25
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-0.6B"} 4096.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="Qwen/Qwen3-0.6B"} 1.795989349134967e+09
`

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatalf("cannot read fixture: %s", err)
	}
	return b
}

func sameFloat(a, b float64) bool {
	return a == b || (math.IsNaN(a) && math.IsNaN(b))
}

func TestParseLineSuccess(t *testing.T) {
	f := func(line, name, labels string, value float64, ts int64, hasTS bool) {
		t.Helper()
		var s Sample
		ok, err := ParseLine([]byte(line), &s)
		if err != nil || !ok {
			t.Fatalf("ParseLine(%q): ok=%v err=%v; want a sample", line, ok, err)
		}
		if string(s.Name) != name || string(s.Labels) != labels || !sameFloat(s.Value, value) ||
			s.Timestamp != ts || s.HasTimestamp != hasTS {
			t.Fatalf("ParseLine(%q) = name %q labels %q value %v ts %d/%v; want %q %q %v %d/%v",
				line, s.Name, s.Labels, s.Value, s.Timestamp, s.HasTimestamp, name, labels, value, ts, hasTS)
		}
	}
	const q = `engine="0",model_name="Qwen/Qwen3-0.6B"`
	f(`vllm:kv_cache_usage_perc{`+q+`} 0.25`, "vllm:kv_cache_usage_perc", q, 0.25, 0, false)
	f(`vllm:prefix_cache_queries_total{`+q+`} 4096.0`, "vllm:prefix_cache_queries_total", q, 4096, 0, false)
	f(`vllm:prefix_cache_queries_created{`+q+`} 1.7959893491349826e+09`, "vllm:prefix_cache_queries_created", q, 1.7959893491349826e+09, 0, false)
	f(`vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 4.0`, "vllm:e2e_request_latency_seconds_bucket", `engine="1",le="+Inf",model_name="m"`, 4, 0, false)
	f(`process_open_fds 6.0`, "process_open_fds", "", 6, 0, false)
	f(`:odd_name_ 1`, ":odd_name_", "", 1, 0, false)

	// Special values, Go-style and exponent floats (strconv, like Prometheus).
	f(`g NaN`, "g", "", math.NaN(), 0, false)
	f(`g +Inf`, "g", "", math.Inf(1), 0, false)
	f(`g -Inf`, "g", "", math.Inf(-1), 0, false)
	f(`g Inf`, "g", "", math.Inf(1), 0, false)
	f(`g -0.5`, "g", "", -0.5, 0, false)
	f(`g 1e-3`, "g", "", 0.001, 0, false)
	f(`g 2.9110272e+07`, "g", "", 2.9110272e+07, 0, false)

	// Timestamps, whitespace, CRLF, exemplars.
	f(`g 1 1700000000000`, "g", "", 1, 1700000000000, true)
	f(`g{a="b"} 2 -5`, "g", `a="b"`, 2, -5, true)
	f("g 3\r\n", "g", "", 3, 0, false)
	f("g 3\r", "g", "", 3, 0, false)
	f("  \tg\t \t3 \t 7\t ", "g", "", 3, 7, true)
	f(`g { a = "b" , c="d" } 4`, "g", ` a = "b" , c="d" `, 4, 0, false)
	f(`g{} 5`, "g", "", 5, 0, false)
	f(`g{a="b",} 6`, "g", `a="b",`, 6, 0, false)
	f(`h_bucket{le="0.5"} 3 # {trace_id="abc"} 0.4 1.6e9`, "h_bucket", `le="0.5"`, 3, 0, false)
	f(`h_bucket{le="0.5"} 3 123 # {trace_id="abc"} 0.4`, "h_bucket", `le="0.5"`, 3, 123, true)

	// Escapes and odd bytes inside label values do not end the block.
	f(`g{p="a\"}b",q="c\\"} 1`, "g", `p="a\"}b",q="c\\"`, 1, 0, false)
	f(`g{p="{,=}#"} 1`, "g", `p="{,=}#"`, 1, 0, false)
	f(`g{p="ünï"} 1`, "g", `p="ünï"`, 1, 0, false)
}

func TestParseLineSkip(t *testing.T) {
	f := func(line string) {
		t.Helper()
		var s Sample
		ok, err := ParseLine([]byte(line), &s)
		if ok || err != nil {
			t.Fatalf("ParseLine(%q): ok=%v err=%v; want a skipped line", line, ok, err)
		}
	}
	f(``)
	f(`   `)
	f("\r\n")
	f("\t\r")
	f(`#`)
	f(`# HELP vllm:num_requests_running Number of requests in model execution batches.`)
	f(`# TYPE vllm:num_requests_running gauge`)
	f(`  # TYPE indented comment`)
	f(`# EOF`)
}

func TestParseLineError(t *testing.T) {
	f := func(line string) {
		t.Helper()
		var s Sample
		ok, err := ParseLine([]byte(line), &s)
		if ok || err == nil {
			t.Fatalf("ParseLine(%q): ok=%v err=%v; want an error", line, ok, err)
		}
		if !strings.HasPrefix(err.Error(), "cannot parse Prometheus line") {
			t.Fatalf("ParseLine(%q): unexpected error text %q", line, err)
		}
		if s.Name != nil || s.Labels != nil {
			t.Fatalf("ParseLine(%q) left a name or labels behind after an error", line)
		}
	}
	f(`g`)
	f(`g `)
	f(`g{a="b"}`)
	f(`g{`)
	f(`g{a="b"`)
	f(`g{a="b" 1`)
	f(`g{a="b} 1`)
	f(`g{a="b\"} 1`)
	f(`g{a="b\`)
	f(`g{a=b} 1`)
	f(`g{a} 1`)
	f(`g{a=} 1`)
	f(`g{="b"} 1`)
	f(`g{,a="b"} 1`)
	f(`g{a="b",,c="d"} 1`)
	f(`g{a="b" c="d"} 1`)
	f(`g{1a="b"} 1`)
	f(`g{a-b="c"} 1`)
	f(`g{a:b="c"} 1`)
	f(`g bar`)
	f(`g 1 2 3`)
	f(`g 1 1.5`)
	f(`g 1 abc`)
	f(`g 1_000`)
	f(`g 0x1p-2`)
	f(`g 0x10`)
	f(`g 1,5`)
	f(`1g 1`)
	f(`g-h 1`)
	f(`g.h 1`)
	f(`{__name__="g"} 1`)
	f(`{"utf8.name"} 1`)
	f(`<html><body>Not Found</body></html>`)
	f(`{"error":"not found"}`)
	f(`g}{ 1`)
}

func TestSampleLabel(t *testing.T) {
	f := func(line, name, want string, wantOK bool) {
		t.Helper()
		var s Sample
		if ok, err := ParseLine([]byte(line), &s); !ok || err != nil {
			t.Fatalf("ParseLine(%q): ok=%v err=%v", line, ok, err)
		}
		v, ok := s.Label(name)
		if ok != wantOK || string(v) != want {
			t.Fatalf("Label(%q) of %q = %q, %v; want %q, %v", name, line, v, ok, want, wantOK)
		}
	}
	const line = `vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-0.6B"} 7.0`
	f(line, "engine", "0", true)
	f(line, "model_name", "Qwen/Qwen3-0.6B", true)
	f(line, "model", "", false)
	f(line, "engine_type", "", false)
	f(line, "", "", false)
	f(`g 1`, "engine", "", false)
	f(`g{} 1`, "engine", "", false)
	f(`g{engine_type="unified",engine="3"} 1`, "engine", "3", true)
	f(`g{engine="3",engine_type="unified"} 1`, "engine_type", "unified", true)
	f(`g{ a = "x" , b = "y" , } 1`, "b", "y", true)
	f(`g{a=""} 1`, "a", "", true)

	// Escapes of the text format: \\ \" \n; other backslashes stay.
	const esc = `g{path="C:\\dir\\",quote="say \"hi\"",nl="a\nb",odd="x\ty",plain="p"} 1`
	f(esc, "path", `C:\dir\`, true)
	f(esc, "quote", `say "hi"`, true)
	f(esc, "nl", "a\nb", true)
	f(esc, "odd", `x\ty`, true)
	f(esc, "plain", "p", true)
}

func TestSampleLabelOrderIndependence(t *testing.T) {
	labels := []string{`engine="1"`, `le="0.25"`, `model_name="m \"q\""`, `finished_reason="stop"`}
	want := map[string]string{"engine": "1", "le": "0.25", "model_name": `m "q"`, "finished_reason": "stop"}
	n := 0
	var permute func(k int)
	permute = func(k int) {
		if k == len(labels) {
			n++
			line := "vllm:request_success_total{" + strings.Join(labels, ",") + "} 675.0"
			var s Sample
			if ok, err := ParseLine([]byte(line), &s); !ok || err != nil {
				t.Fatalf("ParseLine(%q): ok=%v err=%v", line, ok, err)
			}
			if string(s.Name) != "vllm:request_success_total" || s.Value != 675 {
				t.Fatalf("ParseLine(%q): name %q value %v", line, s.Name, s.Value)
			}
			for name, v := range want {
				if got, ok := s.Label(name); !ok || string(got) != v {
					t.Fatalf("Label(%q) of %q = %q, %v; want %q", name, line, got, ok, v)
				}
			}
			return
		}
		for i := k; i < len(labels); i++ {
			labels[k], labels[i] = labels[i], labels[k]
			permute(k + 1)
			labels[k], labels[i] = labels[i], labels[k]
		}
	}
	permute(0)
	if n != 24 {
		t.Fatalf("checked %d orders; want 24", n)
	}
}

func TestScannerTV9(t *testing.T) {
	var sc Scanner
	sc.Init([]byte(tv9))
	type row struct {
		name  string
		model string
		value float64
	}
	var got []row
	for sc.Next() {
		s := sc.Sample()
		m, _ := s.Label("model_name")
		got = append(got, row{string(s.Name), string(m), s.Value})
	}
	want := []row{
		{"vllm:kv_cache_usage_perc", "Qwen/Qwen3-0.6B", 0.25},
		{"vllm:prefix_cache_queries_total", "Qwen/Qwen3-0.6B", 4096},
		// The _created companion is its own name, not a second sample of the counter.
		{"vllm:prefix_cache_queries_created", "Qwen/Qwen3-0.6B", 1.795989349134967e+09},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d samples %v; want %v", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sample %d = %+v; want %+v", i, got[i], want[i])
		}
	}
	if sc.BadLines() != 0 || sc.Err() != nil {
		t.Fatalf("unexpected bad lines: %d %v", sc.BadLines(), sc.Err())
	}
}

// countSampleLines counts the lines that are neither blank nor comments, the way a reader of the
// format would.
func countSampleLines(body []byte) int {
	n := 0
	for _, line := range bytes.Split(body, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			n++
		}
	}
	return n
}

func TestScannerVLLMFixture(t *testing.T) {
	body := readFixture(t, "vllm_metrics.txt")
	var sc Scanner
	sc.Init(body)
	var samples, buckets, infBuckets, created, totals int
	engines := map[string]int{}
	for sc.Next() {
		s := sc.Sample()
		samples++
		name := string(s.Name)
		if strings.HasSuffix(name, "_bucket") {
			buckets++
			le, ok := s.Label("le")
			if !ok {
				t.Fatalf("bucket %s{%s} without le", name, s.Labels)
			}
			if string(le) == "+Inf" {
				infBuckets++
			}
		}
		if strings.HasSuffix(name, "_created") {
			created++
		}
		if strings.HasSuffix(name, "_total") {
			totals++
		}
		if strings.HasPrefix(name, "vllm:") {
			if e, ok := s.Label("engine"); ok {
				engines[string(e)]++
			}
		}
	}
	if sc.BadLines() != 0 {
		t.Fatalf("unexpected bad lines: %d, first: %v", sc.BadLines(), sc.Err())
	}
	if want := countSampleLines(body); samples != want {
		t.Fatalf("scanned %d samples; the fixture has %d sample lines", samples, want)
	}
	// 7 histograms x 2 engines, each with one +Inf bucket.
	if infBuckets != 14 || buckets < 14*10 {
		t.Fatalf("got %d buckets, %d +Inf buckets; want >= 140 and 14", buckets, infBuckets)
	}
	if created == 0 || totals == 0 {
		t.Fatalf("got %d _created and %d _total samples; want both", created, totals)
	}
	if len(engines) != 2 || engines["0"] != engines["1"] {
		t.Fatalf("engine label counts %v; want two engines with the same series", engines)
	}
}

func TestScannerSGLangFixture(t *testing.T) {
	body := readFixture(t, "sglang_metrics.txt")
	var sc Scanner
	sc.Init(body)
	samples := 0
	running := 0.0
	for sc.Next() {
		samples++
		if s := sc.Sample(); string(s.Name) == "sglang:num_running_reqs" {
			running += s.Value
		}
	}
	if sc.BadLines() != 0 || samples != countSampleLines(body) || running != 20 {
		t.Fatalf("samples %d (want %d), bad lines %d, running %v (want 20)", samples, countSampleLines(body), sc.BadLines(), running)
	}
}

func TestScannerGarbage(t *testing.T) {
	body := "# TYPE a gauge\r\n" +
		"a 1\r\n" +
		"<html>\r\n" +
		"\r\n" +
		"b{x=\"1\"} 2\n" +
		"c{x=1} 3\n" +
		"d 4 5 6\n" +
		"e{y=\"z\"} 5 1700000000000" // no final newline
	var sc Scanner
	sc.Init([]byte(body))
	var names []string
	var values []float64
	for sc.Next() {
		names = append(names, string(sc.Sample().Name))
		values = append(values, sc.Sample().Value)
	}
	if strings.Join(names, ",") != "a,b,e" || values[0] != 1 || values[1] != 2 || values[2] != 5 {
		t.Fatalf("got %v %v; want a,b,e with 1 2 5", names, values)
	}
	if sc.BadLines() != 3 {
		t.Fatalf("BadLines() = %d; want 3", sc.BadLines())
	}
	if err := sc.Err(); err == nil || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "<html>") {
		t.Fatalf("Err() = %v; want the first bad line (3, <html>)", err)
	}

	// Init resets the state.
	sc.Init([]byte("ok 1\n"))
	if !sc.Next() || sc.Next() || sc.BadLines() != 0 || sc.Err() != nil {
		t.Fatalf("Init did not reset the scanner")
	}
}

func FuzzParseLine(f *testing.F) {
	for _, line := range strings.Split(tv9, "\n") {
		f.Add([]byte(line))
	}
	for _, line := range []string{
		`vllm:e2e_request_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 4.0`,
		`g{path="C:\\dir\\",quote="say \"hi\"",nl="a\nb"} 1 1700000000000`,
		`g{ a = "b" , } NaN # {t="x"} 1`,
		`g{a="b\`, `g{,} 1`, "g 1\r\n", `<html>`, `{`, `}`, `"`,
	} {
		f.Add([]byte(line))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var s Sample
		ok, err := ParseLine(line, &s)
		if ok && err != nil {
			t.Fatalf("ok with an error: %v", err)
		}
		if !ok {
			return
		}
		if len(s.Name) == 0 || metricNameLen(s.Name) != len(s.Name) {
			t.Fatalf("invalid name %q", s.Name)
		}
		// A validated label block must walk to its end without errors, and every label must be found.
		i, labels := 0, 0
		for {
			n, _, _, next, err := nextLabel(s.Labels, i)
			if err != nil {
				t.Fatalf("validated labels %q do not walk: %v", s.Labels, err)
			}
			if n == nil {
				if next != len(s.Labels) {
					t.Fatalf("label walk of %q stopped at %d", s.Labels, next)
				}
				break
			}
			if _, found := s.Label(string(n)); !found {
				t.Fatalf("Label(%q) not found in %q", n, s.Labels)
			}
			labels++
			i = next
		}
		if labels > len(s.Labels) {
			t.Fatalf("too many labels")
		}
	})
}
