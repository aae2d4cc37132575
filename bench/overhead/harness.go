package overhead

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// harness holds the processes of a report: the upstream, every case's gateways, their addresses and the
// load generator's clients. Not safe for concurrent set-up; its measurements may run while others read it.
type harness struct {
	o       *Options
	dir     string
	addrs   map[string]string      // unit key -> host:port
	procs   map[string]*fleet.Proc // "upstream", and a unit key for each gateway process
	clients map[string]*fasthttp.HostClient
	chunks  int // deltas per stream the upstream sends
}

// newHarness returns an empty harness that writes its processes' configs into dir.
func newHarness(o *Options, dir string) *harness {
	return &harness{o: o, dir: dir, addrs: map[string]string{}, procs: map[string]*fleet.Proc{},
		clients: map[string]*fasthttp.HostClient{}, chunks: o.streamChunks}
}

// start launches the upstream, then for each case a Rolter, the yardsticks (with a RefProxy) and (when
// found) an HAProxy, and waits until each answers. It sets rep.Paths, rep.Versions and rep.Notes.
func (r *harness) start(ctx context.Context, rep *Report) error {
	upstream, err := r.startUpstream()
	if err != nil {
		return err
	}
	r.describePaths(rep)
	for _, c := range rep.Cases {
		r.addrs[unit{c, PathDirect}.key()] = upstream
		if err := r.startRolter(ctx, c, upstream); err != nil {
			return err
		}
		if err := r.startYardsticks(ctx, c, upstream); err != nil {
			return err
		}
		if err := r.startHAProxy(ctx, c, upstream); err != nil {
			return err
		}
	}
	for key, a := range r.addrs {
		r.clients[key] = &fasthttp.HostClient{
			Addr: a, MaxConns: r.o.ThroughputConcurrency + 8, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
			MaxIdleConnDuration: time.Minute,
		}
	}
	return nil
}

// startUpstream starts the fake upstream, unless Options.UpstreamAddr names one already listening, and
// returns its address.
func (r *harness) startUpstream() (string, error) {
	o := r.o
	if o.UpstreamAddr != "" {
		return o.UpstreamAddr, nil
	}
	up, addr, err := fleet.StartProc("fake upstream", o.Upstream, []string{"-listen", "127.0.0.1:0",
		"-chunks", strconv.Itoa(o.streamChunks), "-gap", o.streamGap.String()}, "listening http://", 10*time.Second)
	if err != nil {
		return "", err
	}
	r.procs["upstream"] = up
	return addr, nil
}

// describePaths sets the paths the report measures, in their order, and the versions of the binaries.
func (r *harness) describePaths(rep *Report) {
	o := r.o
	rep.Paths = []string{PathDirect, PathRolter}
	if o.HAProxy == "" {
		rep.Notes = append(rep.Notes, "HAProxy not found (make bench-overhead installs the Debian package): no HAProxy column, no ratios.")
	} else {
		rep.Paths = append(rep.Paths, PathHAProxy)
		if out, err := exec.Command(o.HAProxy, "-v").Output(); err == nil {
			rep.Versions["haproxy"] = string(bytes.TrimSpace(bytes.SplitN(out, []byte("\n"), 2)[0]))
		}
	}
	if out, err := exec.Command(o.Rolter, "version").Output(); err == nil {
		rep.Versions["rolter"] = string(bytes.TrimSpace(out))
	}
	if o.RefProxy != "" {
		for _, y := range yardsticks {
			rep.Paths = append(rep.Paths, y.path)
		}
	}
}

// listen picks a free loopback port for u and records it as u's address.
func (r *harness) listen(u unit) (string, error) {
	port, err := fleet.FreePort()
	if err != nil {
		return "", err
	}
	r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
	return r.addrs[u.key()], nil
}

// writeConfig writes text into the work directory as name and returns its path.
func (r *harness) writeConfig(name, text string) (string, error) {
	path := filepath.Join(r.dir, name)
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return "", fmt.Errorf("cannot write %q: %w", path, err)
	}
	return path, nil
}

func (r *harness) stopAll() {
	var keys []string
	for k := range r.procs {
		if k != "upstream" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range append(keys, "upstream") {
		if p := r.procs[k]; p != nil {
			p.Stop()
		}
	}
	for _, c := range r.clients {
		c.CloseIdleConnections()
	}
}
