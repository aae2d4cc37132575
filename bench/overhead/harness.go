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

// overheadRun holds the processes of a report.
type overheadRun struct {
	o       *Options
	dir     string
	addrs   map[string]string      // unit key -> host:port
	procs   map[string]*fleet.Proc // "upstream", and a unit key for each gateway process
	clients map[string]*fasthttp.HostClient
	chunks  int // deltas per stream the upstream sends
}

// start launches the upstream, then for each case a Rolter and (when found) an HAProxy, and waits
// until each answers.
func (r *overheadRun) start(ctx context.Context, rep *Report) error {
	o := r.o
	upstream := o.UpstreamAddr
	if upstream == "" {
		up, addr, err := fleet.StartProc("fake upstream", o.Upstream, []string{"-listen", "127.0.0.1:0",
			"-chunks", strconv.Itoa(o.streamChunks), "-gap", o.streamGap.String()}, "listening http://", 10*time.Second)
		if err != nil {
			return err
		}
		r.procs["upstream"] = up
		upstream = addr
	}
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
	for _, c := range rep.Cases {
		r.addrs[unit{c, PathDirect}.key()] = upstream

		u := unit{c, PathRolter}
		port, err := fleet.FreePort()
		if err != nil {
			return err
		}
		r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
		routingMemory := 0
		if c.PromptBytes > 0 {
			routingMemory = o.RoutingMemory
		}
		cfgPath := filepath.Join(r.dir, "rolter-"+c.Name+".toml")
		if err := os.WriteFile(cfgPath, []byte(RolterConfig(c, r.addrs[u.key()], upstream, routingMemory)), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", cfgPath, err)
		}
		gw, _, err := fleet.StartProc("rolter ("+c.Name+")", o.Rolter, []string{"serve", "-config", cfgPath, "-log-level", "warn"}, "", 0)
		if err != nil {
			return err
		}
		r.procs[u.gateway()] = gw
		if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/healthz", 15*time.Second, gw); err != nil {
			return fmt.Errorf("rolter (%s) did not come up: %w", c.Name, err)
		}

		for _, y := range yardsticks {
			if o.RefProxy == "" {
				break
			}
			u = unit{c, y.path}
			if port, err = fleet.FreePort(); err != nil {
				return err
			}
			r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
			name := "refproxy -mode " + y.mode + " (" + c.Name + ")"
			np, _, err := fleet.StartProc(name, o.RefProxy, []string{"-mode", y.mode, "-listen", r.addrs[u.key()], "-upstream", upstream}, "", 0)
			if err != nil {
				return err
			}
			r.procs[u.gateway()] = np
			// Its GET /healthz is the upstream's, relayed.
			if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/healthz", 15*time.Second, np); err != nil {
				return fmt.Errorf("%s did not come up: %w", name, err)
			}
		}

		if o.HAProxy == "" {
			continue
		}
		u = unit{c, PathHAProxy}
		if port, err = fleet.FreePort(); err != nil {
			return err
		}
		r.addrs[u.key()] = fmt.Sprintf("127.0.0.1:%d", port)
		hcfg := filepath.Join(r.dir, "haproxy-"+c.Name+".cfg")
		text := haproxyConfig(c, r.addrs[u.key()], upstream, filepath.Join(r.dir, "haproxy-"+c.Name+".pid"))
		if err := os.WriteFile(hcfg, []byte(text), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", hcfg, err)
		}
		// -db keeps it in the foreground: it is our child, stopped by its PID.
		hp, _, err := fleet.StartProc("haproxy ("+c.Name+")", o.HAProxy, []string{"-f", hcfg, "-db"}, "", 0)
		if err != nil {
			return err
		}
		r.procs[u.gateway()] = hp
		if err := fleet.WaitHTTP(ctx, "http://"+r.addrs[u.key()]+"/health", 15*time.Second, hp); err != nil {
			return fmt.Errorf("haproxy (%s) did not come up: %w", c.Name, err)
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

func (r *overheadRun) stopAll() {
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
