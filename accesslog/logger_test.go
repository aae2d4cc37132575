package accesslog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func enabledConfig(dest string) Config {
	c := DefaultConfig()
	c.Access = dest
	return c
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read %q: %s", path, err)
	}
	if len(b) == 0 {
		return nil
	}
	if b[len(b)-1] != '\n' {
		t.Fatalf("%q does not end with a newline", path)
	}
	return strings.Split(string(b[:len(b)-1]), "\n")
}

func TestWantSampling(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	f := func(sample float64, lo, hi int) {
		t.Helper()
		c := enabledConfig(os.DevNull)
		c.Sample = sample
		l, err := New(c, quietLog)
		if err != nil {
			t.Fatalf("New: %s", err)
		}
		defer l.Close()
		n := 0
		for i := 0; i < 10_000; i++ {
			if l.Want(10*time.Millisecond, rng.Uint64()) {
				n++
			}
		}
		if n < lo || n > hi {
			t.Fatalf("sample %v: %d of 10000 wanted; want %d..%d", sample, n, lo, hi)
		}
	}
	// Binomial(10000, p): the bounds are more than 6 standard deviations wide.
	f(1, 10_000, 10_000)
	f(0.1, 800, 1200)
	f(0.5, 4700, 5300)
	f(0.01, 40, 170)
	f(0.9999999, 9990, 10_000)
	// The edges of rnd.
	c := enabledConfig(os.DevNull)
	c.Sample = 0.5
	l, _ := New(c, quietLog)
	defer l.Close()
	if !l.Want(0, 0) || l.Want(0, ^uint64(0)) || !l.Want(0, 1<<63-1) || l.Want(0, 1<<63) {
		t.Fatalf("sample 0.5 must want exactly rnd < 2^63")
	}
}

func TestWantSlowOnly(t *testing.T) {
	c := enabledConfig(os.DevNull)
	c.Sample = 0
	c.SlowMs = 500
	l, err := New(c, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	defer l.Close()
	f := func(d time.Duration, rnd uint64, want bool) {
		t.Helper()
		if got := l.Want(d, rnd); got != want {
			t.Fatalf("Want(%v, %d) = %v; want %v", d, rnd, got, want)
		}
	}
	f(499*time.Millisecond, 0, false)
	f(499*time.Millisecond, ^uint64(0), false)
	f(500*time.Millisecond, ^uint64(0), true)
	f(time.Hour, 12345, true)

	// slow_ms on top of a sample: slow requests are logged whatever rnd says.
	c.Sample = 0.1
	l2, _ := New(c, quietLog)
	defer l2.Close()
	if !l2.Want(600*time.Millisecond, ^uint64(0)) || l2.Want(100*time.Millisecond, ^uint64(0)) {
		t.Fatalf("sample 0.1 + slow_ms 500: slow must always be wanted, fast only when sampled")
	}
}

func TestDisabledLogger(t *testing.T) {
	for _, l := range []*Logger{nil, mustNew(t, DefaultConfig())} {
		var r Record
		r.Reset()
		l.Log(&r)
		if l.Enabled() || l.Want(time.Hour, 0) || l.Dropped() != 0 || l.Written() != 0 || l.Failed() != 0 {
			t.Fatalf("a disabled logger must do nothing")
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %s", err)
		}
	}
}

func mustNew(t *testing.T, c Config) *Logger {
	t.Helper()
	l, err := New(c, quietLog)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	return l
}

func TestNewErrors(t *testing.T) {
	f := func(c Config, want string) {
		t.Helper()
		l, err := New(c, quietLog)
		if err == nil {
			l.Close()
			t.Fatalf("New(%+v) succeeded; want %q", c, want)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("New error %q; want it to contain %q", err, want)
		}
	}
	f(enabledConfig(filepath.Join(t.TempDir(), "nodir", "access.log")), "create its directory first")
	c := enabledConfig("stdout")
	c.Sample = 3
	f(c, "log.sample")
}

// TestLogFileJSONAndText writes through a real rotated file in both formats and reads every line back.
func TestLogFileJSONAndText(t *testing.T) {
	for _, format := range []string{FormatJSON, FormatText} {
		path := filepath.Join(t.TempDir(), "access.log")
		c := enabledConfig(path)
		c.Format = format
		l := mustNew(t, c)
		r := exampleRecord()
		for i := 0; i < 1000; i++ {
			r.Retries = i
			l.Log(r)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %s", err)
		}
		lines := readLines(t, path)
		if len(lines) != 1000 || l.Written() != 1000 || l.Dropped() != 0 || l.Failed() != 0 {
			t.Fatalf("%s: %d lines, written %d, dropped %d, failed %d; want 1000 written", format, len(lines), l.Written(), l.Dropped(), l.Failed())
		}
		for i, line := range lines {
			r.Retries = i
			var want []byte
			if format == FormatJSON {
				want = AppendJSON(nil, r)
			} else {
				want = AppendText(nil, r)
			}
			if line+"\n" != string(want) {
				t.Fatalf("%s line %d = %q; want %q", format, i, line, want)
			}
		}
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("access log file mode: %v %v; want 0600", st.Mode().Perm(), err)
		}
	}
}

func TestLogRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	c := enabledConfig(path)
	c.MaxBytes = 4 << 10
	c.Keep = 2
	l := mustNew(t, c)
	r := exampleRecord()
	for i := 0; i < 200; i++ { // ~100 KiB: many rotations
		l.Log(r)
		if i%20 == 0 {
			time.Sleep(time.Millisecond) // let the writer flush smaller batches
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	total := 0
	for _, p := range []string{path, path + ".1", path + ".2"} {
		for _, line := range readLines(t, p) {
			if !json.Valid([]byte(line)) {
				t.Fatalf("%s holds a broken line %q", p, line)
			}
			total++
		}
	}
	if _, err := os.Stat(path + ".3"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keep = 2 left a third rotated file")
	}
	if total == 0 || total >= 200 {
		t.Fatalf("%d lines in the kept files; want some, and fewer than all 200 (older files dropped)", total)
	}
}

// TestLineAppearsWhileIdle: with nothing else queued, a line is written at once, without Close.
func TestLineAppearsWhileIdle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l := mustNew(t, enabledConfig(path))
	defer l.Close()
	l.Log(exampleRecord())
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if string(b) == exampleJSON {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("line not written within 5 s of an idle queue: file holds %q", b)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFullQueueDropsWithoutBlocking blocks the writer on a pipe nobody reads: Log must keep returning at
// once, drop what does not fit and count it; once the pipe is read, every line not dropped arrives.
func TestFullQueueDropsWithoutBlocking(t *testing.T) {
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatalf("pipe: %s", err)
	}
	defer pr.Close()
	c := enabledConfig("pipe")
	c.QueueSize = 16
	l := newLogger(c, pw, "pipe", quietLog)

	const n = 20_000 // ~9 MiB of JSON: far more than the pipe buffer and the queue hold
	r := exampleRecord()
	var slowest time.Duration
	start := time.Now()
	for i := 0; i < n; i++ {
		t0 := time.Now()
		l.Log(r)
		slowest = max(slowest, time.Since(t0))
	}
	elapsed := time.Since(start)
	dropped := l.Dropped()
	if dropped == 0 || dropped >= n {
		t.Fatalf("dropped %d of %d; want some dropped and some queued", dropped, n)
	}
	// A blocked call would wait for as long as the destination is blocked (until the test unblocks it),
	// so bounds generous enough for a loaded machine still catch one.
	if elapsed > 5*time.Second || slowest > time.Second {
		t.Fatalf("Log blocked: %d calls took %v, the slowest %v", n, elapsed, slowest)
	}

	var lines int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 4096), 1<<20)
		for sc.Scan() {
			if sc.Text()+"\n" != exampleJSON {
				t.Errorf("line %d = %q", lines, sc.Text())
			}
			lines++
		}
	}()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	wg.Wait()
	if uint64(lines) != l.Written() || l.Written()+l.Dropped() != n || l.Failed() != 0 {
		t.Fatalf("read %d lines; written %d + dropped %d (failed %d) != %d", lines, l.Written(), l.Dropped(), l.Failed(), n)
	}
}

func TestCloseDrainsAndIsIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	c := enabledConfig(path)
	c.QueueSize = 5000
	l := mustNew(t, c)
	for i := 0; i < 5000; i++ {
		l.Log(exampleRecord())
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	if got := len(readLines(t, path)); got != 5000 || l.Dropped() != 0 {
		t.Fatalf("after Close: %d lines, %d dropped; want 5000 and 0", got, l.Dropped())
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %s", err)
	}
	l.Log(exampleRecord())
	if l.Dropped() != 1 {
		t.Fatalf("Log after Close: dropped = %d; want 1", l.Dropped())
	}
}

// failingWriter accepts the first ok bytes, then fails every write.
type failingWriter struct {
	ok  int
	buf bytes.Buffer
}

func (w *failingWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.ok-w.buf.Len())
	w.buf.Write(p[:n])
	if n < len(p) {
		return n, errors.New("disk full")
	}
	return n, nil
}

func (w *failingWriter) Close() error { return nil }

func TestWriteErrorsCountLostLines(t *testing.T) {
	lineLen := len(exampleJSON)
	w := &failingWriter{ok: 2*lineLen + 10} // two lines and part of a third
	var logs bytes.Buffer
	l := newLogger(enabledConfig("w"), w, "w", slog.New(slog.NewTextHandler(&logs, nil)))
	for i := 0; i < 5; i++ {
		l.Log(exampleRecord())
	}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	if l.Written() != 2 || l.Failed() != 3 {
		t.Fatalf("written %d, failed %d; want 2 and 3", l.Written(), l.Failed())
	}
	if !strings.Contains(logs.String(), "access log write failed") || !strings.Contains(logs.String(), "disk full") {
		t.Fatalf("write failure not logged: %q", logs.String())
	}
}
