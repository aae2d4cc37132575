package logfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("cannot read %q: %s", path, err)
	}
	return string(b)
}

func mustWrite(t *testing.T, lf *File, s string) {
	t.Helper()
	n, err := lf.Write([]byte(s))
	if err != nil || n != len(s) {
		t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
	}
}

func TestOpenCreatesWithMode0600AndAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	lf, err := Open(path, Options{})
	if err != nil {
		t.Fatalf("Open: %s", err)
	}
	mustWrite(t, lf, "one\n")
	if err := lf.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat: %s", err)
	}
	if m := st.Mode().Perm(); m != 0o600 {
		t.Fatalf("mode = %o; want 600", m)
	}

	lf, err = Open(path, Options{})
	if err != nil {
		t.Fatalf("reopen: %s", err)
	}
	if lf.size != 4 {
		t.Fatalf("size after reopen = %d; want 4 (the existing bytes count towards max_bytes)", lf.size)
	}
	mustWrite(t, lf, "two\n")
	_ = lf.Close()
	if got := readFile(t, path); got != "one\ntwo\n" {
		t.Fatalf("content = %q; want both lines", got)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	f := func(dest string, opts Options, want string) {
		t.Helper()
		lf, err := Open(dest, opts)
		if err == nil {
			_ = lf.Close()
			t.Fatalf("Open(%q) succeeded; want an error containing %q", dest, want)
		}
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("Open(%q) error = %q; want it to contain %q", dest, err, want)
		}
	}
	f("", Options{}, "empty")
	f(filepath.Join(dir, "missing", "access.log"), Options{}, "create its directory first")
	f(dir, Options{}, "cannot open log file")
	f(filepath.Join(dir, "x.log"), Options{MaxBytes: -1}, "negative")
	f(filepath.Join(dir, "x.log"), Options{Keep: -1}, "negative")
	if _, err := os.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open created the missing directory (stat err %v)", err)
	}
}

func TestRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.log")
	lf, err := Open(path, Options{MaxBytes: 10, Keep: 3})
	if err != nil {
		t.Fatalf("Open: %s", err)
	}
	defer lf.Close()
	// Each line is 5 bytes: two fit in 10, the third rotates.
	for i := 0; i < 9; i++ {
		mustWrite(t, lf, "line"+string(rune('0'+i)))
	}
	// 9 lines of 5 bytes, 2 per file: a.log holds 8, a.log.1 6-7, a.log.2 4-5, a.log.3 2-3; 0-1 dropped.
	f := func(name, want string) {
		t.Helper()
		if got := readFile(t, name); got != want {
			t.Fatalf("%s = %q; want %q", filepath.Base(name), got, want)
		}
	}
	f(path, "line8")
	f(path+".1", "line6line7")
	f(path+".2", "line4line5")
	f(path+".3", "line2line3")
	if _, err := os.Stat(path + ".4"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a.log.4 exists; keep = 3 must drop older files")
	}
	if lf.Rotations() != 4 {
		t.Fatalf("Rotations = %d; want 4", lf.Rotations())
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("reopened file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
}

func TestRotationNeverSplitsAWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a.log")
	lf, err := Open(path, Options{MaxBytes: 8, Keep: 2})
	if err != nil {
		t.Fatalf("Open: %s", err)
	}
	defer lf.Close()
	mustWrite(t, lf, "abc\n")
	mustWrite(t, lf, "a line longer than max\n") // rotates, then goes whole into the new file
	mustWrite(t, lf, "x\n")                      // the file is over max: rotates again
	f := func(name, want string) {
		t.Helper()
		if got := readFile(t, name); got != want {
			t.Fatalf("%s = %q; want %q", filepath.Base(name), got, want)
		}
	}
	f(path, "x\n")
	f(path+".1", "a line longer than max\n")
	f(path+".2", "abc\n")
}

func TestRotationFailureKeepsWriting(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.log")
	// A non-empty directory where a.log.1 should go makes the rename fail, for root too.
	if err := os.MkdirAll(filepath.Join(path+".1", "x"), 0o700); err != nil {
		t.Fatalf("mkdir: %s", err)
	}
	lf, err := Open(path, Options{MaxBytes: 4, Keep: 1})
	if err != nil {
		t.Fatalf("Open: %s", err)
	}
	defer lf.Close()
	mustWrite(t, lf, "abc\n")
	n, err := lf.Write([]byte("def\n"))
	if n != 4 || err == nil || !strings.Contains(err.Error(), "cannot rotate") {
		t.Fatalf("Write = %d, %v; want 4 and a rotation error", n, err)
	}
	// The next write does not retry the rename at once, and succeeds.
	mustWrite(t, lf, "ghi\n")
	if got := readFile(t, path); got != "abc\ndef\nghi\n" {
		t.Fatalf("content = %q; want every line in the unrotated file", got)
	}
	if lf.Rotations() != 0 {
		t.Fatalf("Rotations = %d; want 0", lf.Rotations())
	}
}

func TestStdStreams(t *testing.T) {
	for _, dest := range []string{Stdout, Stderr} {
		lf, err := Open(dest, Options{})
		if err != nil {
			t.Fatalf("Open(%q): %s", dest, err)
		}
		if err := lf.Close(); err != nil {
			t.Fatalf("Close(%q): %s", dest, err)
		}
	}
	// Closing the destination must not close the process's stream.
	if _, err := os.Stdout.Stat(); err != nil {
		t.Fatalf("stdout closed by Close: %s", err)
	}
}

func TestWriteAfterClose(t *testing.T) {
	lf, err := Open(filepath.Join(t.TempDir(), "a.log"), Options{})
	if err != nil {
		t.Fatalf("Open: %s", err)
	}
	if err := lf.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
	if err := lf.Close(); err != nil {
		t.Fatalf("second Close: %s", err)
	}
	if _, err := lf.Write([]byte("x")); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("Write after Close = %v; want os.ErrClosed", err)
	}
}

func TestDeviceIsNotRotated(t *testing.T) {
	lf, err := Open(os.DevNull, Options{MaxBytes: 1, Keep: 1})
	if err != nil {
		t.Fatalf("Open(%q): %s", os.DevNull, err)
	}
	mustWrite(t, lf, "abc\n")
	mustWrite(t, lf, "def\n")
	if lf.Rotations() != 0 {
		t.Fatalf("Rotations = %d; a device must never be renamed", lf.Rotations())
	}
	if err := lf.Close(); err != nil {
		t.Fatalf("Close: %s", err)
	}
}
