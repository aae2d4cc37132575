package telemetry

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"
)

// Sample is one sample line of the Prometheus text exposition format (version 0.0.4):
//
//	metric_name[{label="value",...}] value [timestamp_ms] [# exemplar]
//
// Every byte slice in a Sample points into the line passed to ParseLine (or the body given to
// Scanner.Init), or into the Sample's own scratch buffer, and is valid only until that line is
// modified or the Sample is passed to ParseLine again. Copy what must be kept.
//
// A Sample is not safe for concurrent use: Label may write to its scratch buffer.
type Sample struct {
	// Name is the metric name exactly as exposed, suffix included: `vllm:prefix_cache_queries_total`
	// and its `vllm:prefix_cache_queries_created` companion are two different names.
	Name []byte

	// Labels is the raw label block between the braces, escapes untouched, already validated by
	// ParseLine. It is empty when the sample has no labels. Use Label to read one value.
	Labels []byte

	// Value is the sample value; NaN, +Inf and -Inf are kept as such.
	Value float64

	// Timestamp is the optional trailing timestamp in milliseconds since the epoch; it is
	// meaningful only when HasTimestamp is true.
	Timestamp    int64
	HasTimestamp bool

	// buf holds the unescaped value of the last escaped label read by Label.
	buf []byte
}

// Label returns the value of the label called name, unescaped (`\"`, `\\` and `\n`), and whether the
// label is present. It scans the raw label block without allocating (an escaped value is unescaped into
// a scratch buffer kept by s, which grows once and is then reused).
//
// The returned slice is valid until the next call to Label or ParseLine on s, or until the parsed line
// is modified.
func (s *Sample) Label(name string) ([]byte, bool) {
	b := s.Labels
	i := 0
	for {
		n, v, escaped, next, err := nextLabel(b, i)
		if err != nil || n == nil {
			// The block was validated by ParseLine; an error here means the caller built the Sample
			// by hand.
			return nil, false
		}
		if string(n) == name {
			if !escaped {
				return v, true
			}
			s.buf = appendUnescaped(s.buf[:0], v)
			return s.buf, true
		}
		i = next
	}
}

// Errors for the syntax of one line. ParseLine wraps them with the offending line; Scanner wraps
// only the first bad line of a body, so a body full of garbage does not build an error per line.
var (
	errMetricName = errors.New("missing or invalid metric name")
	errLabelName  = errors.New("missing or invalid label name")
	errLabelEqual = errors.New("missing '=' after label name")
	errLabelQuote = errors.New("label value must start with '\"'")
	errLabelValue = errors.New("unterminated label value")
	errLabelSep   = errors.New("missing ',' or '}' after label value")
	errValue      = errors.New("missing or invalid sample value")
	errTimestamp  = errors.New("invalid timestamp")
	errTrailing   = errors.New("unexpected data after the sample")
)

// ParseLine parses one line of the Prometheus text format into s.
//
// It returns ok=false with a nil error for lines that hold no sample: blank lines and comments
// (`# HELP`, `# TYPE`, `# EOF`, anything starting with '#'). A line that is neither a comment nor a
// valid sample returns ok=false and an error; the caller may skip it and go on with the next line.
// The trailing '\n' or "\r\n" is optional. Labels may come in any order. OpenMetrics exemplars
// (` # {...} v`) after the value or timestamp are ignored.
//
// ParseLine does not allocate for well-formed lines; s aliases line (see Sample).
func ParseLine(line []byte, s *Sample) (ok bool, err error) {
	ok, err = parseLine(line, s)
	if err != nil {
		return false, fmt.Errorf("cannot parse Prometheus line %q: %w", truncateLine(line), err)
	}
	return ok, nil
}

func parseLine(line []byte, s *Sample) (bool, error) {
	s.Name, s.Labels, s.Value, s.Timestamp, s.HasTimestamp = nil, nil, 0, 0, false

	b := trimSpace(line)
	if len(b) == 0 || b[0] == '#' {
		return false, nil
	}

	n := metricNameLen(b)
	if n == 0 {
		return false, errMetricName
	}
	name := b[:n]
	b = b[n:]
	if len(b) > 0 && b[0] != '{' && !isSpace(b[0]) {
		return false, errMetricName
	}
	b = skipSpace(b)
	var labels []byte
	if len(b) > 0 && b[0] == '{' {
		end, err := scanLabels(b)
		if err != nil {
			return false, err
		}
		labels = b[1 : end-1]
		b = skipSpace(b[end:])
	}

	tok, b := nextToken(b)
	if len(tok) == 0 {
		return false, errValue
	}
	v, ok := parseFloat(tok)
	if !ok {
		return false, errValue
	}
	b = skipSpace(b)
	var ts int64
	hasTS := false
	if len(b) > 0 && b[0] != '#' {
		tok, b = nextToken(b)
		ts, ok = parseInt(tok)
		if !ok {
			return false, errTimestamp
		}
		hasTS = true
		b = skipSpace(b)
	}
	if len(b) > 0 && b[0] != '#' {
		return false, errTrailing
	}

	s.Name, s.Labels, s.Value, s.Timestamp, s.HasTimestamp = name, labels, v, ts, hasTS
	return true, nil
}

// Scanner walks the sample lines of a whole Prometheus text body, skipping comments, blank lines
// and garbage lines. A garbage line is counted (BadLines) and the first one is kept as Err; the scan
// goes on with the next line, so one malformed series does not hide the rest of a scrape.
//
// The zero Scanner is ready after Init. Scanning well-formed lines does not allocate; only garbage
// lines may (strconv's error for a bad number, and the wrapped error of the first bad line). A Scanner is not safe for concurrent use.
type Scanner struct {
	b    []byte
	line int
	s    Sample
	bad  int
	err  error
}

// Init resets sc to scan body. body must not be modified until the scan is done: samples alias it.
func (sc *Scanner) Init(body []byte) {
	sc.b = body
	sc.line = 0
	sc.bad = 0
	sc.err = nil
	sc.s.Name, sc.s.Labels = nil, nil
}

// Next advances to the next sample line and reports whether there is one.
func (sc *Scanner) Next() bool {
	for len(sc.b) > 0 {
		var line []byte
		if i := bytes.IndexByte(sc.b, '\n'); i >= 0 {
			line, sc.b = sc.b[:i], sc.b[i+1:]
		} else {
			line, sc.b = sc.b, nil
		}
		sc.line++
		ok, err := parseLine(line, &sc.s)
		if err != nil {
			sc.bad++
			if sc.err == nil {
				sc.err = fmt.Errorf("cannot parse Prometheus line %d %q: %w", sc.line, truncateLine(line), err)
			}
			continue
		}
		if ok {
			return true
		}
	}
	return false
}

// Sample returns the current sample. It is valid until the next call to Next or Init.
func (sc *Scanner) Sample() *Sample {
	return &sc.s
}

// BadLines returns the number of garbage lines skipped so far.
func (sc *Scanner) BadLines() int {
	return sc.bad
}

// Err returns the error of the first garbage line skipped since Init, or nil.
func (sc *Scanner) Err() error {
	return sc.err
}

// scanLabels validates the label block that starts at b[0] == '{' and returns the index just past
// its closing '}'.
func scanLabels(b []byte) (int, error) {
	i := 1
	for {
		n, _, _, next, err := nextLabel(b, i)
		if err != nil {
			return 0, err
		}
		if n == nil {
			if next >= len(b) || b[next] != '}' {
				return 0, errLabelSep
			}
			return next + 1, nil
		}
		i = next
	}
}

// nextLabel reads the label that starts at b[i] (after optional whitespace). It returns the label
// name, its raw value, whether the value holds escapes, and the index to continue from (past the
// ',' that follows the value, if any). When no label starts at b[i] because the block ends there (a
// '}' or the end of b, as for the bare block kept in Sample.Labels) it returns a nil name and the index
// of that end; a trailing ',' before the end is allowed, as in the Prometheus parser.
func nextLabel(b []byte, i int) (name, value []byte, escaped bool, next int, err error) {
	i = skipSpaceAt(b, i)
	if i >= len(b) || b[i] == '}' {
		return nil, nil, false, i, nil
	}
	start := i
	if !isLabelStart(b[i]) {
		return nil, nil, false, 0, errLabelName
	}
	for i++; i < len(b) && isLabelChar(b[i]); i++ {
	}
	name = b[start:i]
	i = skipSpaceAt(b, i)
	if i >= len(b) || b[i] != '=' {
		return nil, nil, false, 0, errLabelEqual
	}
	i = skipSpaceAt(b, i+1)
	if i >= len(b) || b[i] != '"' {
		return nil, nil, false, 0, errLabelQuote
	}
	i++
	start = i
	for ; i < len(b) && b[i] != '"'; i++ {
		if b[i] == '\\' {
			// A backslash escapes the next byte, whatever it is.
			escaped = true
			i++
		}
	}
	if i >= len(b) {
		return nil, nil, false, 0, errLabelValue
	}
	value = b[start:i]
	i = skipSpaceAt(b, i+1)
	switch {
	case i < len(b) && b[i] == ',':
		i++
	case i < len(b) && b[i] != '}':
		return nil, nil, false, 0, errLabelSep
	}
	return name, value, escaped, i, nil
}

// appendUnescaped appends the label value v with the text format's escapes resolved. Like the
// Prometheus parser, only \\, \" and \n are escapes; any other backslash is kept as is.
func appendUnescaped(dst, v []byte) []byte {
	for len(v) > 0 {
		j := bytes.IndexByte(v, '\\')
		if j < 0 || j == len(v)-1 {
			return append(dst, v...)
		}
		dst = append(dst, v[:j]...)
		switch c := v[j+1]; c {
		case 'n':
			dst = append(dst, '\n')
		case '\\', '"':
			dst = append(dst, c)
		default:
			dst = append(dst, '\\', c)
		}
		v = v[j+2:]
	}
	return dst
}

// parseFloat parses a sample value the way the Prometheus text parser does (model/textparse
// promparse.go parseFloat): strconv.ParseFloat (Go floats, exponents, NaN, +Inf, -Inf, any case) minus
// the newer Go literal forms, hex floats and digit separators. unsafe.String avoids copying tok:
// ParseFloat does not keep its argument (it clones it into the error on failure).
func parseFloat(tok []byte) (float64, bool) {
	for _, c := range tok {
		if c == 'p' || c == 'P' || c == '_' {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(unsafe.String(unsafe.SliceData(tok), len(tok)), 64)
	return v, err == nil
}

// parseInt parses a decimal int64 timestamp without allocating.
func parseInt(tok []byte) (int64, bool) {
	v, err := strconv.ParseInt(unsafe.String(unsafe.SliceData(tok), len(tok)), 10, 64)
	return v, err == nil
}

// metricNameLen returns the length of the metric name [a-zA-Z_:][a-zA-Z0-9_:]* at the start of b.
func metricNameLen(b []byte) int {
	if len(b) == 0 || charClass[b[0]]&metricStart == 0 {
		return 0
	}
	i := 1
	for i < len(b) && charClass[b[i]]&metricChar != 0 {
		i++
	}
	return i
}

func isLabelStart(c byte) bool {
	return charClass[c]&labelStart != 0
}

func isLabelChar(c byte) bool {
	return charClass[c]&labelChar != 0
}

// charClass classifies name bytes with one table lookup instead of range comparisons; names are most
// of the bytes of a /metrics body (BenchmarkParseLine).
var charClass = func() (t [256]uint8) {
	for c := 0; c < 256; c++ {
		letter := c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		digit := c >= '0' && c <= '9'
		if letter {
			t[c] |= labelStart | metricStart
		}
		if letter || digit {
			t[c] |= labelChar | metricChar
		}
		if c == ':' {
			t[c] |= metricStart | metricChar
		}
	}
	return t
}()

const (
	labelStart = 1 << iota
	labelChar
	metricStart
	metricChar
)

func isSpace(c byte) bool {
	return c == ' ' || c == '\t'
}

func skipSpace(b []byte) []byte {
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	return b
}

func skipSpaceAt(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// trimSpace drops spaces, tabs and a CR of CRLF line endings from both ends.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && (isSpace(b[0]) || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (isSpace(b[len(b)-1]) || b[len(b)-1] == '\r' || b[len(b)-1] == '\n') {
		b = b[:len(b)-1]
	}
	return b
}

// nextToken splits b at the first space or tab.
func nextToken(b []byte) (tok, rest []byte) {
	for i, c := range b {
		if isSpace(c) {
			return b[:i], b[i:]
		}
	}
	return b, nil
}

// truncateLine keeps error messages short when an engine serves a huge garbage line.
func truncateLine(line []byte) []byte {
	const max = 200
	if len(line) > max {
		return line[:max]
	}
	return line
}
