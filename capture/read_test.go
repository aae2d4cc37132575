package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
)

func readFile(t *testing.T, path string, o ReadOptions) Trace {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := o.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// near compares arrival times, which go through float seconds.
func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestReadRolter(t *testing.T) {
	tr := readFile(t, "testdata/capture.jsonl", ReadOptions{})
	if tr.Format != FormatRolter || tr.Unit != UnitBytes || tr.Truncated || len(tr.Requests) != 4 || !near(tr.Start, 1764547200.125) {
		t.Fatalf("format %q unit %q truncated %v, %d requests", tr.Format, tr.Unit, tr.Truncated, len(tr.Requests))
	}
	// Sorted by arrival: line 2 (0.125), line 1 (0.250), line 6 (0.500), line 4 (1.000).
	var lines []int
	var times []float64
	for _, r := range tr.Requests {
		lines, times = append(lines, r.Line), append(times, r.Time)
	}
	if !reflect.DeepEqual(lines, []int{2, 1, 6, 4}) || !near(times[0], 0) || !near(times[1], 0.125) || !near(times[2], 0.375) || !near(times[3], 0.875) {
		t.Fatalf("lines %v at %v", lines, times)
	}
	want := Request{Line: 1, Time: tr.Requests[1].Time, Len: 700, BlockLen: 256,
		Blocks:   []uint64{0x1f2e3d4c5b6a7988, 0xa1b2c3d4e5f60718, 0x0011223344556677},
		InTokens: 181, OutTokens: 32, Cached: 128, Session: "5eed00000000beef", Route: "llama", Target: "sim-1",
		Decision: "prefix_hit", Status: 200}
	if got := tr.Requests[1]; !reflect.DeepEqual(got, want) {
		t.Fatalf("line 1:\n got %+v\nwant %+v", got, want)
	}
	// No usage, not answered, upper-case hex, CRLF.
	r := tr.Requests[3]
	if r.InTokens != 0 || r.OutTokens != 0 || r.Cached != -1 || r.Answered() || r.Status != 503 || r.Blocks[1] != 0xfedcba9876543210 || r.Target != "" {
		t.Fatalf("line 4: %+v", r)
	}
	// A key the reader does not know is ignored; no "cached" is unknown, not 0.
	if r := tr.Requests[2]; r.Cached != -1 || r.InTokens != 70 || !r.Answered() || r.Covered() != 256 {
		t.Fatalf("line 6: %+v", r)
	}
	if c := tr.Requests[0].Covered(); c != 600 {
		t.Fatalf("covered %d, want 600", c)
	}
}

func TestReadMooncake(t *testing.T) {
	tr := readFile(t, "testdata/mooncake.jsonl", ReadOptions{})
	if tr.Format != FormatMooncake || tr.Unit != UnitTokens || len(tr.Requests) != 5 || tr.Start != 0 {
		t.Fatalf("format %q unit %q, %d requests", tr.Format, tr.Unit, len(tr.Requests))
	}
	var lines []int
	for _, r := range tr.Requests {
		lines = append(lines, r.Line)
	}
	// Equal timestamps keep the file's order; the blank line 3 counts.
	if !reflect.DeepEqual(lines, []int{1, 2, 5, 4, 6}) {
		t.Fatalf("lines %v", lines)
	}
	want := Request{Line: 5, Time: 1, Len: 2300, BlockLen: MooncakeBlockTokens, Blocks: []uint64{0, 4, 5, 6, 7},
		InTokens: 2300, OutTokens: 25, Cached: -1}
	if got := tr.Requests[2]; !reflect.DeepEqual(got, want) {
		t.Fatalf("line 5:\n got %+v\nwant %+v", got, want)
	}
	if r := tr.Requests[3]; r.Time != 2.5 || r.OutTokens != 0 || r.Covered() != 300 || !r.Answered() {
		t.Fatalf("line 4: %+v", r)
	}
}

// TestReadRecordRoundTrip: what the gateway writes (Record's JSON) reads back as written.
func TestReadRecordRoundTrip(t *testing.T) {
	cached := 96
	recs := []Record{
		{TS: 1700000000.5, Route: "m", InBytes: 513, In: 140, Out: 7, Cached: &cached, BlockBytes: 256,
			Blocks: []string{"0000000000000001", "00000000000000ff", "ffffffffffffffff"}, Session: "abc", Target: "t", Decision: "session", Score: 0.5, Status: 200},
		{TS: 1700000001, Route: "m", InBytes: 0, BlockBytes: 256, Blocks: []string{}, Score: -1, Status: 429},
	}
	var buf bytes.Buffer
	for _, r := range recs {
		line, _ := json.Marshal(r)
		buf.Write(append(line, '\n'))
	}
	tr, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	a, b := tr.Requests[0], tr.Requests[1]
	if a.Len != 513 || a.InTokens != 140 || a.OutTokens != 7 || a.Cached != 96 || !reflect.DeepEqual(a.Blocks, []uint64{1, 255, math.MaxUint64}) ||
		a.Session != "abc" || a.Decision != "session" || a.Covered() != 513 {
		t.Fatalf("first: %+v", a)
	}
	if b.Time != 0.5 || b.Len != 0 || len(b.Blocks) != 0 || b.Answered() {
		t.Fatalf("second: %+v", b)
	}
}

func TestReadBlankLines(t *testing.T) {
	f := func(in string, wantN int, wantFormat string) {
		t.Helper()
		tr, err := Read(strings.NewReader(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		if len(tr.Requests) != wantN || tr.Format != wantFormat {
			t.Fatalf("%q: %d requests of format %q, want %d of %q", in, len(tr.Requests), tr.Format, wantN, wantFormat)
		}
	}
	const m = `{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [7]}`
	f("", 0, "")
	f("\n\n  \r\n\t\n", 0, "")
	f(m, 1, FormatMooncake)
	f(m+"\r\n\r\n"+m+"\r\n", 2, FormatMooncake)
	f("\xef\xbb\xbf"+m+"\n", 1, FormatMooncake) // a byte order mark
	f("\n   \n"+m+"\n\n", 1, FormatMooncake)
}

// TestReadBadLines: every bad line is reported with its number.
func TestReadBadLines(t *testing.T) {
	const (
		m  = `{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [7]}`
		r  = `{"ts": 1, "in_bytes": 10, "block_bytes": 8, "blocks": ["0000000000000001", "0000000000000002"], "status": 200}`
		nl = "\n"
	)
	f := func(in string, wantLine int, wantText string) {
		t.Helper()
		_, err := Read(strings.NewReader(in))
		var le *LineError
		if !errors.As(err, &le) {
			t.Fatalf("%.60q: error %v, want a line error", in, err)
		}
		if le.Line != wantLine || !strings.Contains(err.Error(), wantText) || !strings.Contains(err.Error(), "cannot read trace: line ") {
			t.Fatalf("%.60q: %q, want line %d and %q", in, err, wantLine, wantText)
		}
	}
	f("not json", 1, "cannot parse")
	f(nl+nl+`{"a": 1}`, 3, "cannot tell the trace format")
	f(`{"hash_ids": [1], "blocks": []}`, 1, "cannot tell the trace format")
	f(`[1, 2]`, 1, "cannot parse")
	f(m+nl+"{oops"+nl, 2, "cannot decode")
	f(m+nl+m+" "+m+nl, 2, "more than one JSON value")
	f(m+nl+nl+r+nl, 3, "not a Mooncake line")
	f(r+nl+m+nl, 2, "not a capture line")
	f(`{"timestamp": -1, "input_length": 10, "hash_ids": []}`, 1, "timestamp -1")
	f(`{"input_length": 10, "hash_ids": []}`, 1, `missing "timestamp"`)
	f(`{"timestamp": 1, "hash_ids": []}`, 1, `missing "input_length"`)
	f(`{"timestamp": 1, "input_length": 0, "hash_ids": []}`, 1, "input_length 0")
	f(`{"timestamp": 1, "input_length": 10, "output_length": -2, "hash_ids": []}`, 1, "output_length -2")
	f(`{"timestamp": 1, "input_length": 10, "hash_ids": [-3]}`, 1, "hash_ids[0] = -3")
	f(`{"timestamp": 1, "input_length": 10, "hash_ids": [1.5]}`, 1, `"hash_ids" must be int64`)
	f(`{"timestamp": "x", "input_length": 10, "hash_ids": []}`, 1, `"timestamp" must be float64`)
	f(r+nl+`{"ts": 1, "in_bytes": 10, "block_bytes": 8, "blocks": ["0000000000000001", "xyz"]}`, 2, `blocks[1] = "xyz" is not 16 hex digits`)
	f(`{"ts": 1, "in_bytes": 10, "block_bytes": 8, "blocks": ["00000000000000001"]}`, 1, "is not 16 hex digits")
	f(`{"ts": 1, "in_bytes": 10, "block_bytes": 8, "blocks": ["0000000000000001", "0000000000000002", "0000000000000003"]}`, 1, "3 blocks of 8 bytes for in_bytes 10: at most 2")
	f(`{"ts": 1, "in_bytes": 10, "block_bytes": 0, "blocks": []}`, 1, "block_bytes 0")
	f(`{"ts": 1, "in_bytes": -1, "block_bytes": 8, "blocks": []}`, 1, "in_bytes -1")
	f(`{"in_bytes": 1, "block_bytes": 8, "blocks": []}`, 1, `missing "ts"`)
	f(`{"ts": 1, "block_bytes": 8, "blocks": []}`, 1, `missing "in_bytes"`)
	f(`{"ts": 1, "in_bytes": 10, "in": -5, "block_bytes": 8, "blocks": []}`, 1, "in -5")
	f(`{"ts": 1, "in_bytes": 10, "cached": -5, "block_bytes": 8, "blocks": []}`, 1, "cached -5")
	f(r+nl+r+nl+r+nl+strings.Repeat(" ", MaxLineBytes+1)+nl+r, 4, "longer than") // a blank line too
}

// TestReadLineLimit: a line of exactly MaxLineBytes is read, one byte more is refused, also as
// the file's last line without a newline (TestReadBadLines has one in the middle of a file).
func TestReadLineLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("reads two 16 MiB lines")
	}
	const m = `{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [7]}`
	pad := func(n int) string { return m + strings.Repeat(" ", n-len(m)) }
	for _, c := range []struct {
		in string
		ok bool
	}{
		{pad(MaxLineBytes) + "\n", true},
		{pad(MaxLineBytes + 1), false}, // also as the last line, without a newline
	} {
		tr, err := Read(strings.NewReader(c.in))
		if c.ok && (err != nil || len(tr.Requests) != 1) {
			t.Fatalf("%d bytes: %v", len(c.in), err)
		}
		if !c.ok && (err == nil || !strings.Contains(err.Error(), "line 1: line longer than")) {
			t.Fatalf("%d bytes: %v, want too long", len(c.in), err)
		}
	}
}

func TestReadMaxRequests(t *testing.T) {
	const m = `{"timestamp": %d, "input_length": 10, "output_length": 1, "hash_ids": [7]}`
	var b strings.Builder
	for i := 0; i < 5; i++ {
		b.WriteString(strings.Replace(m, "%d", string(rune('0'+5-i)), 1) + "\n\n")
	}
	f := func(max, wantN int, wantTruncated bool) {
		t.Helper()
		tr, err := ReadOptions{MaxRequests: max}.Read(strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		if len(tr.Requests) != wantN || tr.Truncated != wantTruncated {
			t.Fatalf("max %d: %d requests, truncated %v", max, len(tr.Requests), tr.Truncated)
		}
	}
	f(0, 5, false)
	f(5, 5, false)
	f(3, 3, true)
	f(1, 1, true)
	// Lines past the cap are not read, so a bad one there does not matter.
	tr, err := ReadOptions{MaxRequests: 2}.Read(strings.NewReader(b.String() + "garbage\n"))
	if err != nil || len(tr.Requests) != 2 || !tr.Truncated || tr.Requests[0].Line != 3 {
		t.Fatalf("%v: %+v", err, tr)
	}
}
