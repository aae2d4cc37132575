package accesslog

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/logfile"
)

const (
	// flushInterval bounds how long a line waits in the writer's buffer while the queue never empties.
	flushInterval = 100 * time.Millisecond
	// batchBytes is the size at which the writer's buffer is written out whatever the queue holds.
	batchBytes = 64 << 10
	// errorLogInterval rate-limits the warnings about a failing destination.
	errorLogInterval = time.Minute
)

// Logger writes access-log lines off the request path. Want and Log are called by request goroutines
// and are safe for concurrent use; neither allocates, Want reads only fields fixed at New, and Log's one
// synchronisation is a non-blocking channel send. One writer goroutine, started by New and stopped by
// Close, formats and writes the lines. A nil *Logger, and the Logger of a config with access
// off, are valid and log nothing.
type Logger struct {
	on        bool
	sampleAll bool
	threshold uint64 // with !sampleAll: rnd < threshold is sampled
	slow      time.Duration
	text      bool

	q         chan Record
	stop      chan struct{}
	done      chan struct{}
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	dropped atomic.Uint64
	written atomic.Uint64
	failed  atomic.Uint64

	// Owned by the writer goroutine.
	out      io.WriteCloser
	dest     string
	batch    []byte
	pending  uint64 // lines in batch
	log      *slog.Logger
	lastWarn time.Time
}

// New opens the destination of cfg and starts the writer goroutine. cfg is validated first (its zero
// fields take their defaults, Sample included only through DefaultConfig); a nil logger means
// slog.Default() and receives the writer's own failures, at most one warning a minute. With access off,
// New returns a Logger that logs nothing and starts no goroutine.
func New(cfg Config, logger *slog.Logger) (*Logger, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.Enabled() {
		return &Logger{}, nil
	}
	out, err := logfile.Open(cfg.Access, logfile.Options{MaxBytes: cfg.MaxBytes, Keep: cfg.Keep})
	if err != nil {
		return nil, fmt.Errorf("cannot open access log: %w", err)
	}
	return newLogger(cfg, out, cfg.Access, logger), nil
}

// newLogger starts a Logger writing to out; cfg is valid and enabled.
func newLogger(cfg Config, out io.WriteCloser, dest string, logger *slog.Logger) *Logger {
	if logger == nil {
		logger = slog.Default()
	}
	l := &Logger{
		on:        true,
		sampleAll: cfg.Sample >= 1,
		slow:      time.Duration(cfg.SlowMs) * time.Millisecond,
		text:      cfg.Format == FormatText,
		q:         make(chan Record, cfg.QueueSize),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		out:       out,
		dest:      dest,
		batch:     make([]byte, 0, batchBytes+4<<10),
		log:       logger.With("component", "accesslog"),
	}
	if cfg.Sample > 0 && cfg.Sample < 1 {
		l.threshold = uint64(cfg.Sample * math.Exp2(64))
	}
	go l.run()
	return l
}

// Enabled reports whether l writes lines at all. The engine skips building Records when it is false.
func (l *Logger) Enabled() bool { return l != nil && l.on }

// Want reports whether a request that took d should be logged: always when d is at least slow_ms (with
// slow_ms set), else when rnd, a uniformly random number the caller draws (math/rand/v2 Uint64), falls in
// the sample fraction. It reads only fields fixed at New.
func (l *Logger) Want(d time.Duration, rnd uint64) bool {
	if l == nil || !l.on {
		return false
	}
	if l.slow > 0 && d >= l.slow {
		return true
	}
	return l.sampleAll || rnd < l.threshold
}

// Log queues a copy of r for the writer and returns at once; r may be reused as soon as Log returns. When
// the queue is full, or l is closed, the line is dropped and counted (Dropped): a request never waits for
// the disk. Log does not allocate.
func (l *Logger) Log(r *Record) {
	if l == nil || !l.on {
		return
	}
	if l.closed.Load() {
		l.dropped.Add(1)
		return
	}
	select {
	case l.q <- *r:
	default:
		l.dropped.Add(1)
	}
}

// Dropped returns how many lines were dropped because the queue was full (or Log was called after
// Close), for rolter_access_log_dropped_total.
func (l *Logger) Dropped() uint64 {
	if l == nil {
		return 0
	}
	return l.dropped.Load()
}

// Written returns how many lines the destination accepted.
func (l *Logger) Written() uint64 {
	if l == nil {
		return 0
	}
	return l.written.Load()
}

// Failed returns how many lines were lost to write errors of the destination (disk full, a closed pipe).
func (l *Logger) Failed() uint64 {
	if l == nil {
		return 0
	}
	return l.failed.Load()
}

// Close stops accepting lines, writes every queued one, and closes the destination. It waits for the
// writer, so a destination that blocks (a named pipe nobody reads) blocks Close too. Closing twice
// returns the first result. A Log that races with Close may be lost uncounted.
func (l *Logger) Close() error {
	if l == nil || !l.on {
		return nil
	}
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		close(l.stop)
		<-l.done
		if err := l.out.Close(); err != nil {
			l.closeErr = fmt.Errorf("cannot close access log: %w", err)
		}
	})
	return l.closeErr
}

// run is the writer goroutine: it formats each queued Record into one batch buffer and writes the batch
// when the queue is empty (so an idle gateway's lines are on disk at once), when it is 64 KiB, or at the
// latest every 100 ms while the queue never empties.
func (l *Logger) run() {
	defer close(l.done)
	last := time.Now()
	for {
		select {
		case r := <-l.q:
			l.add(&r)
			if len(l.q) == 0 || len(l.batch) >= batchBytes || time.Since(last) >= flushInterval {
				l.flush()
				last = time.Now()
			}
		case <-l.stop:
			for {
				select {
				case r := <-l.q:
					l.add(&r)
					if len(l.batch) >= batchBytes {
						l.flush()
					}
				default:
					l.flush()
					return
				}
			}
		}
	}
}

// add formats r at the end of the batch. A panic while formatting loses that line only.
func (l *Logger) add(r *Record) {
	n := len(l.batch)
	defer func() {
		if p := recover(); p != nil {
			l.batch = l.batch[:n]
			l.failed.Add(1)
			l.log.Error("panic while formatting an access log line", "panic", p, "stack", string(debug.Stack()))
		}
	}()
	if l.text {
		l.batch = AppendText(l.batch, r)
	} else {
		l.batch = AppendJSON(l.batch, r)
	}
	l.pending++
}

// flush writes the batch. Lines the destination did not take whole are counted as failed.
func (l *Logger) flush() {
	if len(l.batch) == 0 {
		return
	}
	n, err := l.out.Write(l.batch)
	lost := uint64(0)
	if n < len(l.batch) {
		lost = uint64(bytes.Count(l.batch[max(n, 0):], []byte{'\n'}))
	}
	l.written.Add(l.pending - lost)
	l.failed.Add(lost)
	l.batch, l.pending = l.batch[:0], 0
	if err != nil {
		if now := time.Now(); now.Sub(l.lastWarn) >= errorLogInterval {
			l.lastWarn = now
			l.log.Warn("access log write failed", "dest", l.dest, "err", err, "lines_lost_total", l.failed.Load())
		}
	}
	if cap(l.batch) > 4*batchBytes {
		l.batch = make([]byte, 0, batchBytes+4<<10) // a huge line once must not pin its buffer
	}
}
