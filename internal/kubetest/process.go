package kubetest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// process is one child of the harness (etcd, kube-apiserver), its output in a log file of the cluster's
// directory.
type process struct {
	name   string
	cmd    *exec.Cmd
	log    string
	exited chan struct{} // closed when cmd's Wait returned
}

// startProcess starts bin with args, its stdout and stderr in dir/<name>.log.
func startProcess(dir, name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("cannot create the log of %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// The child dies with the test binary, whatever way that ends (a panic, a timeout's SIGQUIT, a kill).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// waitFor calls ready until it reports true, the process exits, or timeout passes; the error then holds the
// tail of the process's log.
func (p *process) waitFor(timeout time.Duration, ready func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited at start: %s", p.name, p.tail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s is not ready after %s: %s", p.name, timeout, p.tail())
		}
	}
	return nil
}

// tail is the end of the process's log, for an error message.
func (p *process) tail() string {
	b, _ := os.ReadFile(p.log)
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return fmt.Sprintf("log %s ends:\n%s", p.log, bytes.TrimSpace(b))
}

// stop asks the process to end (SIGTERM), kills it if it has not after grace, and waits for it.
func (p *process) stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}
