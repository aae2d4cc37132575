package capture

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
)

// Trace formats Read recognises.
const (
	// FormatRolter is the JSONL of Record that [trace] writes.
	FormatRolter = "rolter"
	// FormatMooncake is the public Mooncake trace format (kvcache-ai/Mooncake, FAST'25 traces): one
	// JSON object per line, {"timestamp": ms, "input_length": tokens, "output_length": tokens,
	// "hash_ids": [ints]}, one hash id per MooncakeBlockTokens tokens of the prompt.
	FormatMooncake = "mooncake"
)

// Units of Request.Len and Request.BlockLen.
const (
	UnitBytes  = "bytes"  // FormatRolter: prompt-key bytes
	UnitTokens = "tokens" // FormatMooncake: prompt tokens
)

// MooncakeBlockTokens is the block size of a Mooncake trace's hash_ids.
const MooncakeBlockTokens = 512

// MaxLineBytes is the longest line Read accepts (the newline excluded).
const MaxLineBytes = 16 << 20

// DefaultMaxRequests is ReadOptions.MaxRequests when it is 0.
const DefaultMaxRequests = 100_000

// Trace is a trace read back: the requests, in arrival order, in the form a replay needs whatever
// the file's format.
type Trace struct {
	// Format is FormatRolter or FormatMooncake; "" for a file with no request.
	Format string
	// Unit is the unit of every Request's Len and BlockLen: UnitBytes or UnitTokens.
	Unit string
	// Requests are sorted by Time; requests with equal times keep their order in the file.
	Requests []Request
	// Truncated is set when the file holds more requests than ReadOptions.MaxRequests: only the
	// first MaxRequests lines with a request were read.
	Truncated bool
	// Start is the earliest request's arrival as the file has it, in seconds: Unix time for a
	// capture, seconds from the trace's own origin for Mooncake.
	Start float64
}

// Request is one request of a trace.
type Request struct {
	// Line is the line of the file the request was read from (1-based).
	Line int
	// Time is the arrival time in seconds after the trace's earliest request.
	Time float64
	// Len is the prompt's length in Trace.Unit: in_bytes, or input_length.
	Len int
	// BlockLen is the length of every block but possibly the last, in Trace.Unit: block_bytes, or
	// MooncakeBlockTokens.
	BlockLen int
	// Blocks are the hashes of the prompt's blocks in order, as the file has them: a capture's
	// salted chained hashes, or Mooncake's hash ids. A block is identified by its hash together
	// with the hashes before it (Mooncake's ids are not documented as chained), so two requests
	// share their first k blocks exactly when their first k hashes are equal. Block i covers
	// [i×BlockLen, min((i+1)×BlockLen, Len)) of the prompt; when the blocks cover less than Len
	// (see Covered), the rest of the prompt is unknown and shared with no other request. Blocks a
	// Mooncake line lists past input_length are dropped.
	Blocks []uint64
	// InTokens is the prompt's length in tokens when known: a capture's "in"
	// (usage.prompt_tokens), Mooncake's input_length; 0 when unknown.
	InTokens int
	// OutTokens is the number of output tokens when known: a capture's "out", Mooncake's
	// output_length; 0 when unknown.
	OutTokens int
	// Cached is the capture's delivered cached tokens, -1 when unknown (and for Mooncake).
	Cached int
	// Session is the capture's hashed session id, "" when none (and for Mooncake).
	Session string
	// Route, Target, Decision and Status are the capture's (empty or 0 for Mooncake).
	Route    string
	Target   string
	Decision string
	Status   int
}

// Covered returns the length of the prompt its blocks cover, in the trace's unit.
func (r *Request) Covered() int {
	return min(r.Len, len(r.Blocks)*r.BlockLen)
}

// Answered reports whether the request was answered with a 2xx, or its status is not known.
func (r *Request) Answered() bool {
	return r.Status == 0 || r.Status >= 200 && r.Status < 300
}

// LineError is a problem with one line of a trace.
type LineError struct {
	Line int
	Err  error
}

func (e *LineError) Error() string { return "line " + strconv.Itoa(e.Line) + ": " + e.Err.Error() }

func (e *LineError) Unwrap() error { return e.Err }

// ReadOptions bound Read. The zero value takes the defaults named.
type ReadOptions struct {
	// MaxRequests is the most requests read (DefaultMaxRequests); further lines are not read and
	// the Trace is marked Truncated.
	MaxRequests int
}

// Read reads a trace in either format with the default options. See ReadOptions.Read.
func Read(r io.Reader) (Trace, error) {
	return ReadOptions{}.Read(r)
}

// Read reads a trace: JSONL in FormatRolter or FormatMooncake, the format told by the first line
// that holds a request (a "hash_ids" key: Mooncake; a "blocks" or "block_bytes" key: ours); every
// later line must be in the same format. Blank lines (whitespace only, \r\n included) are
// skipped; a line longer than MaxLineBytes, or one that is not a valid request, stops the read
// with a *LineError (wrapped) naming the line. Unknown keys are ignored, so a newer capture with
// more fields still reads. The requests come back sorted by arrival time.
func (o ReadOptions) Read(r io.Reader) (Trace, error) {
	limit := o.MaxRequests
	if limit <= 0 {
		limit = DefaultMaxRequests
	}
	var tr Trace
	br := bufio.NewReaderSize(r, 64<<10)
	var line []byte
	var times []float64 // absolute arrival times, seconds
	for n := 1; ; n++ {
		var err error
		line, err = readLine(br, line[:0])
		if errors.Is(err, errLineTooLong) {
			return tr, fmt.Errorf("cannot read trace: %w", &LineError{Line: n, Err: err})
		}
		if err != nil && err != io.EOF {
			return tr, fmt.Errorf("cannot read trace: line %d: %w", n, err)
		}
		text := bytes.TrimSpace(line)
		if n == 1 {
			text = bytes.TrimPrefix(text, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
		}
		if len(text) > 0 {
			if len(tr.Requests) == limit {
				tr.Truncated = true
				break
			}
			if tr.Format == "" {
				f, ferr := detectFormat(text)
				if ferr != nil {
					return tr, fmt.Errorf("cannot read trace: %w", &LineError{Line: n, Err: ferr})
				}
				tr.Format = f
				tr.Unit = UnitBytes
				if f == FormatMooncake {
					tr.Unit = UnitTokens
				}
			}
			var req Request
			var at float64
			var perr error
			if tr.Format == FormatMooncake {
				req, at, perr = parseMooncake(text)
			} else {
				req, at, perr = parseRolter(text)
			}
			if perr != nil {
				return tr, fmt.Errorf("cannot read trace: %w", &LineError{Line: n, Err: perr})
			}
			req.Line = n
			tr.Requests = append(tr.Requests, req)
			times = append(times, at)
		}
		if err == io.EOF {
			break
		}
	}
	if len(times) > 0 {
		first := times[0]
		for _, t := range times {
			first = math.Min(first, t)
		}
		tr.Start = first
		for i := range tr.Requests {
			tr.Requests[i].Time = times[i] - first
		}
		sort.SliceStable(tr.Requests, func(i, j int) bool { return tr.Requests[i].Time < tr.Requests[j].Time })
	}
	return tr, nil
}

var errLineTooLong = fmt.Errorf("line longer than %d bytes", MaxLineBytes)

// readLine appends the next line (without its newline) to dst. It returns io.EOF with the last
// line when the input ends, and errLineTooLong when the line exceeds MaxLineBytes (without
// reading the rest of it).
func readLine(br *bufio.Reader, dst []byte) ([]byte, error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if len(dst)+len(chunk) > MaxLineBytes+1 || len(dst)+len(chunk) == MaxLineBytes+1 && chunk[len(chunk)-1] != '\n' {
			return dst, errLineTooLong
		}
		dst = append(dst, chunk...)
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err != nil:
			return dst, err
		}
		return dst[:len(dst)-1], nil
	}
}

// detectFormat tells the format from the keys of a line.
func detectFormat(text []byte) (string, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(text, &keys); err != nil {
		return "", fmt.Errorf("cannot parse %q as a JSON object: %w", clip(text), err)
	}
	_, mooncake := keys["hash_ids"]
	_, blocks := keys["blocks"]
	_, blockBytes := keys["block_bytes"]
	switch {
	case mooncake && !blocks && !blockBytes:
		return FormatMooncake, nil
	case (blocks || blockBytes) && !mooncake:
		return FormatRolter, nil
	}
	return "", fmt.Errorf("cannot tell the trace format of %q: want a capture line (with \"blocks\" and \"block_bytes\") or a Mooncake line (with \"hash_ids\")", clip(text))
}

// mooncakeLine is one line of a Mooncake trace. Pointers tell a missing key from a zero.
type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

func parseMooncake(text []byte) (Request, float64, error) {
	var m mooncakeLine
	if err := decodeLine(text, &m); err != nil {
		return Request{}, 0, err
	}
	switch {
	case m.HashIDs == nil:
		return Request{}, 0, errors.New(`missing "hash_ids": not a Mooncake line like the first one`)
	case m.Timestamp == nil:
		return Request{}, 0, errors.New(`missing "timestamp"`)
	case m.InputLength == nil:
		return Request{}, 0, errors.New(`missing "input_length"`)
	case !(*m.Timestamp >= 0) || math.IsInf(*m.Timestamp, 0):
		return Request{}, 0, fmt.Errorf("timestamp %v must be a number >= 0", *m.Timestamp)
	case *m.InputLength <= 0:
		return Request{}, 0, fmt.Errorf("input_length %d must be > 0", *m.InputLength)
	case m.OutputLength != nil && *m.OutputLength < 0:
		return Request{}, 0, fmt.Errorf("output_length %d must be >= 0", *m.OutputLength)
	}
	r := Request{Len: *m.InputLength, BlockLen: MooncakeBlockTokens, InTokens: *m.InputLength, Cached: -1}
	if m.OutputLength != nil {
		r.OutTokens = *m.OutputLength
	}
	need := (r.Len + MooncakeBlockTokens - 1) / MooncakeBlockTokens
	ids := m.HashIDs[:min(len(m.HashIDs), need)]
	r.Blocks = make([]uint64, len(ids))
	for i, id := range ids {
		if id < 0 {
			return Request{}, 0, fmt.Errorf("hash_ids[%d] = %d must be >= 0", i, id)
		}
		r.Blocks[i] = uint64(id)
	}
	return r, *m.Timestamp / 1000, nil
}

// rolterLine is Record with pointers where a missing key must be told from a zero.
type rolterLine struct {
	Record
	TS         *float64 `json:"ts"`
	InBytes    *int     `json:"in_bytes"`
	BlockBytes *int     `json:"block_bytes"`
	Blocks     []string `json:"blocks"`
}

func parseRolter(text []byte) (Request, float64, error) {
	var l rolterLine
	if err := decodeLine(text, &l); err != nil {
		return Request{}, 0, err
	}
	switch {
	case l.BlockBytes == nil:
		return Request{}, 0, errors.New(`missing "block_bytes": not a capture line like the first one`)
	case l.TS == nil:
		return Request{}, 0, errors.New(`missing "ts"`)
	case l.InBytes == nil:
		return Request{}, 0, errors.New(`missing "in_bytes"`)
	case !(*l.TS >= 0) || math.IsInf(*l.TS, 0):
		return Request{}, 0, fmt.Errorf("ts %v must be a number >= 0", *l.TS)
	case *l.BlockBytes <= 0:
		return Request{}, 0, fmt.Errorf("block_bytes %d must be > 0", *l.BlockBytes)
	case *l.InBytes < 0:
		return Request{}, 0, fmt.Errorf("in_bytes %d must be >= 0", *l.InBytes)
	case l.In < 0 || l.Out < 0:
		return Request{}, 0, fmt.Errorf("in %d and out %d must be >= 0", l.In, l.Out)
	case l.Cached != nil && *l.Cached < 0:
		return Request{}, 0, fmt.Errorf("cached %d must be >= 0", *l.Cached)
	}
	if need := (*l.InBytes + *l.BlockBytes - 1) / *l.BlockBytes; len(l.Blocks) > need {
		return Request{}, 0, fmt.Errorf("%d blocks of %d bytes for in_bytes %d: at most %d", len(l.Blocks), *l.BlockBytes, *l.InBytes, need)
	}
	r := Request{
		Len: *l.InBytes, BlockLen: *l.BlockBytes, InTokens: l.In, OutTokens: l.Out, Cached: -1,
		Session: l.Session, Route: l.Route, Target: l.Target, Decision: l.Decision, Status: l.Status,
		Blocks: make([]uint64, len(l.Blocks)),
	}
	if l.Cached != nil {
		r.Cached = *l.Cached
	}
	for i, h := range l.Blocks {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil || len(h) != 16 {
			return Request{}, 0, fmt.Errorf("blocks[%d] = %q is not 16 hex digits", i, clip([]byte(h)))
		}
		r.Blocks[i] = v
	}
	return r, *l.TS, nil
}

// decodeLine decodes one JSON object, refusing trailing data.
func decodeLine(text []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(text))
	if err := d.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return fmt.Errorf("cannot decode %q: %q must be %s, got %s", clip(text), te.Field, te.Type, te.Value)
		}
		return fmt.Errorf("cannot decode %q: %w", clip(text), err)
	}
	if err := d.Decode(&json.RawMessage{}); err != io.EOF {
		return fmt.Errorf("cannot decode %q: more than one JSON value on the line", clip(text))
	}
	return nil
}

// clip shortens a line for an error message.
func clip(b []byte) string {
	const n = 80
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}
