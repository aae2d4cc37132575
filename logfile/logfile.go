// Package logfile is a log destination: standard output, standard error, or a file with size-based
// rotation.
//
// Rotation is rename-based, as logrotate and lumberjack do it: when a write would take the file past
// MaxBytes, path.Keep is dropped, path.N is renamed to path.N+1 for N from Keep-1 down to 1, path is
// renamed to path.1, and a new path is opened. A reader tailing the file by name (tail -F, Vector, Fluent
// Bit, Promtail) follows the rename; one holding the old descriptor reads the rest of the rotated file.
// A single write is never split across two files, so a line written in one Write is never torn; a write
// larger than MaxBytes goes whole into a fresh file.
//
// A missing directory is an error at Open, not created: the operator chose the path, and a typo in it
// should fail loudly rather than scatter logs into a new directory tree.
package logfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// Defaults applied to zero fields of Options.
const (
	DefaultMaxBytes = 100 << 20
	DefaultKeep     = 5
)

// Destinations that are not file paths. A file named "stdout" in the working directory is "./stdout".
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// newFileMode is the mode of files Open creates: logs name clients and their request ids, so only the
// gateway's user reads them. An existing file keeps its mode.
const newFileMode = 0o600

// rotateRetry is how long a File waits before trying a failed rotation again, so that a directory that
// refuses renames costs one failed rename per interval, not one per write.
const rotateRetry = 10 * time.Second

// Options configure a rotated file. Zero fields take the Default* values.
type Options struct {
	// MaxBytes is the size past which the file is rotated.
	MaxBytes int64
	// Keep is how many rotated files are kept (path.1 is the newest, path.Keep the oldest).
	Keep int
}

// File is an open log destination. Write and Close must be called from one goroutine at a time (the
// owner's writer goroutine); File is not safe for concurrent use.
type File struct {
	path     string // "" for stdout and stderr
	f        *os.File
	std      bool // f is os.Stdout or os.Stderr: never closed, never rotated
	stream   bool // f is a device or a named pipe: never rotated
	size     int64
	maxBytes int64
	keep     int

	rotations uint64
	nextTry   time.Time // after a failed rotation: no new attempt before then
	closed    bool
}

var _ io.WriteCloser = (*File)(nil)

// Open opens dest: "stdout", "stderr", or the path of a file that is appended to (created with mode 0600
// when missing) and rotated by opts. A missing directory is an error. A path naming a device or a named
// pipe is written to without rotation (opening a named pipe waits for its reader, as open(2) does).
func Open(dest string, opts Options) (*File, error) {
	switch dest {
	case "":
		return nil, errors.New("cannot open log destination: empty; want \"stdout\", \"stderr\" or a file path")
	case Stdout:
		return &File{f: os.Stdout, std: true}, nil
	case Stderr:
		return &File{f: os.Stderr, std: true}, nil
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("cannot open log file %q: max bytes %d is negative", dest, opts.MaxBytes)
	}
	if opts.Keep < 0 {
		return nil, fmt.Errorf("cannot open log file %q: keep %d is negative", dest, opts.Keep)
	}
	lf := &File{path: dest, maxBytes: opts.MaxBytes, keep: opts.Keep}
	if lf.maxBytes == 0 {
		lf.maxBytes = DefaultMaxBytes
	}
	if lf.keep == 0 {
		lf.keep = DefaultKeep
	}
	if err := lf.open(); err != nil {
		return nil, err
	}
	return lf, nil
}

// open opens lf.path for appending and reads its size.
func (lf *File) open() error {
	f, err := os.OpenFile(lf.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, newFileMode)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cannot open log file %q: %w (create its directory first)", lf.path, err)
		}
		return fmt.Errorf("cannot open log file %q: %w", lf.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return fmt.Errorf("cannot stat log file %q: %w", lf.path, err)
	}
	if st.IsDir() {
		_ = f.Close()
		return fmt.Errorf("cannot use log file %q: it is a directory", lf.path)
	}
	// A device or a named pipe (/dev/stdout in a container, a log shipper's FIFO) is written to as it is,
	// never rotated.
	lf.f, lf.size, lf.stream = f, st.Size(), !st.Mode().IsRegular()
	return nil
}

// Write writes p whole to the current file, rotating first when p would take a non-empty file past
// MaxBytes. A failed rotation does not lose p: it is appended to the current file, which then grows
// past MaxBytes until a later rotation succeeds, and the rotation error is returned with n == len(p).
func (lf *File) Write(p []byte) (int, error) {
	if lf.closed {
		return 0, os.ErrClosed
	}
	var rotErr error
	if !lf.std && !lf.stream && lf.size > 0 && lf.size+int64(len(p)) > lf.maxBytes {
		if now := time.Now(); !now.Before(lf.nextTry) {
			if rotErr = lf.rotate(); rotErr != nil {
				lf.nextTry = now.Add(rotateRetry)
			}
		}
	}
	n, err := lf.f.Write(p)
	lf.size += int64(n)
	if err != nil {
		return n, fmt.Errorf("cannot write log file %q: %w", lf.name(), err)
	}
	return n, rotErr
}

// rotate shifts the rotated files by one, renames the current file to path.1 and opens a new one. The
// current file is renamed while still open and closed only once its successor is open, so a failure at
// any step leaves a file to write to.
func (lf *File) rotate() error {
	for i := lf.keep - 1; i >= 1; i-- {
		// Renaming over path.i+1 drops the oldest file when i+1 == keep.
		err := os.Rename(lf.rotated(i), lf.rotated(i+1))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cannot rotate log file %q: %w", lf.path, err)
		}
	}
	if err := os.Rename(lf.path, lf.rotated(1)); err != nil {
		return fmt.Errorf("cannot rotate log file %q: %w", lf.path, err)
	}
	old := lf.f
	if err := lf.open(); err != nil {
		// Keep appending to the renamed file (now path.1) rather than losing lines.
		return fmt.Errorf("cannot reopen log file after rotation: %w", err)
	}
	lf.rotations++
	if err := old.Close(); err != nil {
		return fmt.Errorf("cannot close rotated log file %q: %w", lf.rotated(1), err)
	}
	return nil
}

func (lf *File) rotated(i int) string { return lf.path + "." + strconv.Itoa(i) }

func (lf *File) name() string {
	if lf.std {
		return lf.f.Name()
	}
	return lf.path
}

// Rotations returns how many times the file was rotated since Open.
func (lf *File) Rotations() uint64 { return lf.rotations }

// Close closes the file (the standard streams are left open). Closing twice is not an error.
func (lf *File) Close() error {
	if lf.closed {
		return nil
	}
	lf.closed = true
	if lf.std {
		return nil
	}
	if err := lf.f.Close(); err != nil {
		return fmt.Errorf("cannot close log file %q: %w", lf.path, err)
	}
	return nil
}
