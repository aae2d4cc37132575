package engine

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"sync"

	"github.com/VictoriaMetrics/metrics"
	"github.com/cespare/xxhash/v2"

	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/logfile"
	"github.com/rolter-ai/rolter/telemetry"
)

// The routing trace ([trace]; package capture has the line format and its privacy rules). A request that
// reached routing is recorded at its end: the request hashes its prompt key's blocks (xxhash, about 10
// GB/s) into a pooled array and queues a fixed-size record; a goroutine formats and writes the lines. A
// full queue drops the record and counts it: the trace never slows or blocks a request.

// captureWriter is one [trace] destination, the gateway's (Gateway.capture): a reload that leaves [trace]
// unchanged keeps it; one that changes it opens the new one, swaps it in, then closes the old one, whose
// queued lines are written first. A request that ends just as the old one closes loses its line (counted
// as dropped); lines are written whole, one or more per write, so two writers of one file never tear a
// line.
type captureWriter struct {
	cfg   config.TraceConfig
	salt  uint64
	queue chan captureItem
	out   *logfile.File
	quit  chan struct{}
	done  chan struct{}
	log   *slog.Logger
	set   *telemetry.Set
	m     struct{ written, dropped, failed *metrics.Counter }
}

// openCapture returns the writer for cfg: cur when it already writes cfg, nil when [trace] is off, or a new
// one.
func openCapture(cfg config.TraceConfig, cur *captureWriter, log *slog.Logger) (*captureWriter, error) {
	if cfg.Path == "" {
		return nil, nil
	}
	// The salt is read from the environment at each reload, as providers' keys are: a new value is a new writer.
	if cur != nil && cur.cfg == cfg && (cfg.SaltEnv == "" || cur.salt == xxhash.Sum64String(os.Getenv(cfg.SaltEnv))) {
		return cur, nil
	}
	return newCaptureWriter(cfg, log)
}

// swapCapture makes w the gateway's writer and closes the one it replaces. Called under reloadMu.
func (g *Gateway) swapCapture(w *captureWriter) {
	old := g.capture.Swap(w)
	if old == w {
		return
	}
	if w != nil {
		w.set.Register()
	}
	if old != nil {
		old.set.Unregister()
		old.close()
	}
}

// captureItem is one request, as queued.
type captureItem struct {
	ts        int64 // unix nanoseconds
	route     string
	target    string // "" when no target answered
	inBytes   int
	in, out   int64 // usage; -1 when not reported
	cached    int64 // -1 when not reported
	session   uint64
	hasSess   bool
	reason    Reason
	score     float64
	status    int
	blocks    *[]uint64 // from blockPool
	blockSize int
}

var blockPool = sync.Pool{New: func() any { b := make([]uint64, 0, 64); return &b }}

// newCaptureWriter opens the trace file and starts its writer.
func newCaptureWriter(cfg config.TraceConfig, log *slog.Logger) (*captureWriter, error) {
	out, err := logfile.Open(cfg.Path, logfile.Options{MaxBytes: cfg.MaxBytes, Keep: cfg.Keep})
	if err != nil {
		return nil, fmt.Errorf("trace.path: %w", err)
	}
	w := &captureWriter{cfg: cfg, queue: make(chan captureItem, cfg.QueueSize), out: out,
		quit: make(chan struct{}), done: make(chan struct{}), log: log, set: telemetry.NewSet()}
	if cfg.SaltEnv != "" {
		w.salt = xxhash.Sum64String(os.Getenv(cfg.SaltEnv))
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		w.salt = binary.LittleEndian.Uint64(b[:])
	}
	w.m.written = w.set.Counter(telemetry.TraceRecords, `result="written"`)
	w.m.dropped = w.set.Counter(telemetry.TraceRecords, `result="dropped"`)
	w.m.failed = w.set.Counter(telemetry.TraceRecords, `result="write_failed"`)
	go w.run()
	return w, nil
}

// record queues c's line. It runs at the request's end, on the request's goroutine.
func (w *captureWriter) record(c *call, status int) {
	bp := blockPool.Get().(*[]uint64)
	blocks := (*bp)[:0]
	bs := w.cfg.BlockBytes
	prev := uint64(0)
	for off := 0; off < len(c.key); off += bs {
		prev = capture.ChainHash(w.salt, prev, c.key[off:min(off+bs, len(c.key))])
		blocks = append(blocks, prev)
	}
	*bp = blocks
	it := captureItem{ts: c.start.UnixNano(), route: c.route.Model, inBytes: len(c.key), in: -1, out: -1, cached: -1,
		reason: c.decision.Reason, score: c.decision.Score, status: status, blocks: bp, blockSize: bs}
	if c.target != nil {
		it.target = c.target.Provider.Name
	}
	if u := &c.usage; u.found {
		it.in, it.out = u.prompt, u.completed
		if u.hasCached {
			it.cached = u.cached
		}
	}
	if len(c.pick.SessionID) > 0 {
		it.session, it.hasSess = capture.ChainHash(w.salt^sessionDomain, 0, c.pick.SessionID), true
	}
	select {
	case w.queue <- it:
	default:
		w.m.dropped.Inc()
		putBlocks(bp)
	}
}

// sessionDomain separates session hashes from block hashes made with the same salt.
const sessionDomain = 0x5e5510f0_5e5510f0

func putBlocks(bp *[]uint64) {
	if cap(*bp) > 4096 {
		return // a huge prompt's array is not kept
	}
	blockPool.Put(bp)
}

// run formats the queued records and writes them, whole lines per write, when the queue is empty or
// 64 KiB are pending.
func (w *captureWriter) run() {
	defer close(w.done)
	var buf []byte
	n := 0 // records in buf
	flush := func() {
		if len(buf) == 0 {
			return
		}
		// The file takes a write whole or reports why not; a failed rotation still writes (logfile).
		if k, err := w.out.Write(buf); k < len(buf) {
			w.m.failed.Add(n)
			w.log.Warn("cannot write the routing trace", "path", w.cfg.Path, "error", err)
		} else {
			w.m.written.Add(n)
			if err != nil {
				w.log.Warn("routing trace", "path", w.cfg.Path, "error", err)
			}
		}
		buf, n = buf[:0], 0
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
	add := func(it captureItem) {
		buf = appendCapture(buf, &it)
		putBlocks(it.blocks)
		n++
		if len(buf) >= 64<<10 {
			flush()
		}
	}
	for {
		select {
		case it := <-w.queue:
			add(it)
			if len(w.queue) == 0 {
				flush()
			}
		case <-w.quit:
			for {
				select {
				case it := <-w.queue:
					add(it)
				default:
					flush()
					_ = w.out.Close()
					return
				}
			}
		}
	}
}

// close writes what is queued and closes the file. A nil writer is [trace] off.
func (w *captureWriter) close() {
	if w == nil {
		return
	}
	close(w.quit)
	<-w.done
}

// appendCapture appends it as one line of capture.Record's JSON.
func appendCapture(b []byte, it *captureItem) []byte {
	b = append(b, `{"ts":`...)
	b = strconv.AppendFloat(b, float64(it.ts)/1e9, 'f', 6, 64)
	b = append(b, `,"route":`...)
	b = appendJSONString(b, it.route)
	b = append(b, `,"in_bytes":`...)
	b = strconv.AppendInt(b, int64(it.inBytes), 10)
	if it.in >= 0 {
		b = append(b, `,"in":`...)
		b = strconv.AppendInt(b, it.in, 10)
		b = append(b, `,"out":`...)
		b = strconv.AppendInt(b, it.out, 10)
	}
	if it.cached >= 0 {
		b = append(b, `,"cached":`...)
		b = strconv.AppendInt(b, it.cached, 10)
	}
	b = append(b, `,"block_bytes":`...)
	b = strconv.AppendInt(b, int64(it.blockSize), 10)
	b = append(b, `,"blocks":[`...)
	for i, h := range *it.blocks {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendHex16(b, h)
	}
	b = append(b, ']')
	if it.hasSess {
		b = append(b, `,"session":`...)
		b = appendHex16(b, it.session)
	}
	if it.target != "" {
		b = append(b, `,"target":`...)
		b = appendJSONString(b, it.target)
	}
	b = append(b, `,"decision":"`...)
	b = append(b, it.reason.String()...)
	b = append(b, `","score":`...)
	score := it.score
	if math.IsNaN(score) || score < 0 {
		score = -1
	}
	b = strconv.AppendFloat(b, score, 'f', 4, 64)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(it.status), 10)
	return append(b, "}\n"...)
}

// appendHex16 appends h as a JSON string of 16 hex digits.
func appendHex16(b []byte, h uint64) []byte {
	const digits = "0123456789abcdef"
	b = append(b, '"')
	for s := 60; s >= 0; s -= 4 {
		b = append(b, digits[(h>>uint(s))&0xf])
	}
	return append(b, '"')
}
