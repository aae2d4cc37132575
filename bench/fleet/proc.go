package fleet

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
)

// Proc is a child process of a report (the fake upstream, `rolter serve`, HAProxy). It is
// stopped by its PID: SIGTERM, then SIGKILL after a grace period. On Linux it also gets SIGKILL
// when the report process dies (Pdeathsig), so no child outlives a crashed report.
type Proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	err   error // the Wait error, valid after done

	mu     sync.Mutex
	output bytes.Buffer // stdout and stderr, capped
}

const maxProcOutput = 64 << 10

// StartProc starts path with args. When readyPrefix is non-empty it waits (up to timeout) for a
// stdout line starting with it and returns the rest of that line.
func StartProc(name, path string, args []string, readyPrefix string, timeout time.Duration) (*Proc, string, error) {
	return StartProcEnv(name, path, args, nil, readyPrefix, timeout)
}

// StartProcEnv is StartProc with env added to this process's environment.
func StartProcEnv(name, path string, args, env []string, readyPrefix string, timeout time.Duration) (*Proc, string, error) {
	p := &Proc{name: name, cmd: exec.Command(path, args...), done: make(chan struct{})}
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.SysProcAttr = sysProcAttr()
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, "", fmt.Errorf("cannot start %s: %w", name, err)
	}
	p.cmd.Stderr = writerFunc(p.capture)
	// A pipe the child may watch: it reaches EOF when this process exits, however it exits.
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, "", fmt.Errorf("cannot start %s: %w", name, err)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("cannot start %s (%s): %w", name, path, err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			p.capture([]byte(line + "\n"))
			select {
			case lines <- line:
			default:
			}
		}
		close(lines)
	}()
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	if readyPrefix == "" {
		return p, "", nil
	}
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				p.Stop()
				return nil, "", fmt.Errorf("%s exited before it was ready: %s", name, p.Tail())
			}
			if rest, ok := strings.CutPrefix(line, readyPrefix); ok {
				return p, strings.TrimSpace(rest), nil
			}
		case <-deadline:
			p.Stop()
			return nil, "", fmt.Errorf("%s was not ready after %s: %s", name, timeout, p.Tail())
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *Proc) capture(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.output.Len() < maxProcOutput {
		p.output.Write(b[:min(len(b), maxProcOutput-p.output.Len())])
	}
	return len(b), nil
}

// Tail returns the last lines the process wrote.
func (p *Proc) Tail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := strings.TrimSpace(p.output.String())
	if len(s) > 2000 {
		s = "..." + s[len(s)-2000:]
	}
	if s == "" {
		return "(no output)"
	}
	return s
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Started reports whether the process was started (a PID exists).
func (p *Proc) Started() bool { return p.cmd.Process != nil }

// Alive reports whether the process has not exited.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Stop ends the process by its PID: SIGTERM, SIGKILL after 5s. It is idempotent.
func (p *Proc) Stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	_ = p.stdin.Close()
	if !p.Alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Terminate asks the process to exit (SIGTERM) and waits up to timeout for it; then it kills it and
// reports that it did not exit.
func (p *Proc) Terminate(timeout time.Duration) error {
	_ = p.stdin.Close()
	if !p.Alive() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(timeout):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not exit within %s of SIGTERM: %s", p.name, timeout, p.Tail())
}

// ReadRSS returns the resident set size of pid in bytes (VmRSS in /proc/PID/status).
func ReadRSS(pid int) (int64, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("cannot read the RSS of pid %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("cannot parse VmRSS %q of pid %d: %w", rest, pid, err)
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// FreePort returns a loopback port that was free a moment ago (freeport.Loopback: below the ephemeral
// range, where another package's test server cannot take it before the child binds it).
func FreePort() (int, error) { return freeport.Loopback() }

// WaitHTTP polls url until it answers 200 or timeout passes. The 200 counts only if p is still running a
// moment later: a child that could not bind its port exits, and another process answering there must not
// pass for it.
func WaitHTTP(ctx context.Context, url string, timeout time.Duration, p *Proc) error {
	deadline := time.Now().Add(timeout)
	c := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if p != nil && !p.Alive() {
			return fmt.Errorf("%s exited: %s", p.name, p.Tail())
		}
		resp, err := c.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if p == nil {
					return nil
				}
				time.Sleep(100 * time.Millisecond)
				if !p.Alive() {
					return fmt.Errorf("%s exited: %s", p.name, p.Tail())
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("no 200 from " + url + " after " + timeout.String())
}

// LookSbin finds a binary in PATH, then in /usr/sbin (Debian's daemons), or returns "".
func LookSbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/" + name); err == nil {
		return "/usr/sbin/" + name
	}
	return ""
}
