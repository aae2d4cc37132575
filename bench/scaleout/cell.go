package scaleout

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/sim"
)

// cell is the processes of one cell: in-process engines, gateway processes, HAProxy.
type cell struct {
	dir       string
	sims      []*sim.Engine
	names     []string
	gws       []*fleet.Proc
	gwURLs    []string
	haproxy   *fleet.Proc
	nats      *fleet.Proc // the cell's nats-server, for the +cluster variant
	statsSock string
	URL       string // HAProxy's frontend
}

// start starts the engines, n gateways on the same config (each on its own port) and HAProxy in
// front of them, and waits until each answers. On error the caller still calls stop.
func (c *cell) start(ctx context.Context, o *Options, sc sim.Config, strategy string, n int) error {
	if err := c.startEngines(ctx, o.Engines, sc); err != nil {
		return err
	}
	if err := c.startGateways(ctx, o, sc, strategy, n); err != nil {
		return err
	}
	return c.startHAProxy(ctx, o.HAProxy)
}

// startEngines starts n simulated engines configured by sc, each on its own port with its KV event
// stream when the build has one, and waits until each answers.
func (c *cell) startEngines(ctx context.Context, n int, sc sim.Config) error {
	for i := 0; i < n; i++ {
		cfg := sc
		cfg.EngineLabel = fmt.Sprint(i)
		cfg.Port = 0
		if kvindex.Supported {
			cfg.KVEvents = "tcp://127.0.0.1:*"
		}
		e, err := sim.New(cfg)
		if err != nil {
			return fmt.Errorf("cannot configure simulated engine %d: %w", i+1, err)
		}
		if err := e.Start(); err != nil {
			return fmt.Errorf("cannot start simulated engine %d: %w", i+1, err)
		}
		c.sims = append(c.sims, e)
		c.names = append(c.names, fmt.Sprintf("sim-%d", i+1))
		// Stopping an engine whose server has not started serving yet would race with fasthttp's Serve.
		if err := fleet.WaitHTTP(ctx, e.URL()+"/health", 10*time.Second, nil); err != nil {
			return fmt.Errorf("simulated engine %d does not answer: %w", i+1, err)
		}
	}
	return nil
}

// startGateways starts n gateway processes over the cell's engines, with the config strategy's variant
// adds (and the cell's nats-server when it needs one), and waits until each answers.
func (c *cell) startGateways(ctx context.Context, o *Options, sc sim.Config, strategy string, n int) error {
	urls := make([]string, len(c.sims))
	kv := make([]string, len(c.sims))
	for i, e := range c.sims {
		urls[i], kv[i] = e.URL(), e.KVEventsEndpoint()
	}
	base, local, cluster := variant(strategy)
	extra := ""
	if local {
		extra = "\n[routes.params]\nhome = false\n"
	}
	if cluster {
		url, err := c.startNATS(ctx, o.NATSServer)
		if err != nil {
			return err
		}
		extra = fmt.Sprintf("\n[cluster]\nnats_url = %q\n", url)
	}
	// Start every gateway before waiting for any: they boot side by side.
	for i := 0; i < n; i++ {
		port, err := fleet.FreePort()
		if err != nil {
			return err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		path := filepath.Join(c.dir, fmt.Sprintf("rolter-%d.toml", i+1))
		if err := os.WriteFile(path, []byte(gatewayConfig(addr, base, urls, kv, sc.Model)+extra), 0o644); err != nil {
			return fmt.Errorf("cannot write %q: %w", path, err)
		}
		p, _, err := fleet.StartProc(fmt.Sprintf("rolter gateway %d", i+1), o.Rolter, []string{"serve", "-config", path, "-log-level", "warn"}, "", 0)
		if err != nil {
			return err
		}
		c.gws = append(c.gws, p)
		c.gwURLs = append(c.gwURLs, "http://"+addr)
	}
	for i, p := range c.gws {
		if err := fleet.WaitHTTP(ctx, c.gwURLs[i]+"/healthz", 15*time.Second, p); err != nil {
			return fmt.Errorf("gateway %d did not come up: %w", i+1, err)
		}
	}
	return nil
}

// startHAProxy starts HAProxy (the binary bin) in front of the cell's gateways and waits until its
// frontend answers.
func (c *cell) startHAProxy(ctx context.Context, bin string) error {
	port, err := fleet.FreePort()
	if err != nil {
		return err
	}
	front := fmt.Sprintf("127.0.0.1:%d", port)
	c.statsSock = filepath.Join(c.dir, "haproxy.sock")
	text, err := haproxyConfig(front, c.gwURLs, filepath.Join(c.dir, "haproxy.pid"), c.statsSock)
	if err != nil {
		return err
	}
	hcfg := filepath.Join(c.dir, "haproxy.cfg")
	if err := os.WriteFile(hcfg, []byte(text), 0o644); err != nil {
		return fmt.Errorf("cannot write %q: %w", hcfg, err)
	}
	// -db keeps it in the foreground: it is our child, stopped by its PID.
	hp, _, err := fleet.StartProc("haproxy", bin, []string{"-f", hcfg, "-db"}, "", 0)
	if err != nil {
		return err
	}
	c.haproxy = hp
	c.URL = "http://" + front
	if err := fleet.WaitHTTP(ctx, c.URL+"/healthz", 15*time.Second, hp); err != nil {
		return fmt.Errorf("haproxy did not come up: %w", err)
	}
	return nil
}

// startNATS starts the cell's nats-server on loopback ports (client and monitoring) and returns its URL
// once its /healthz answers. Fresh for every cell: no evidence outlives its cell.
func (c *cell) startNATS(ctx context.Context, bin string) (string, error) {
	port, err := fleet.FreePort()
	if err != nil {
		return "", err
	}
	mport, err := fleet.FreePort()
	if err != nil {
		return "", err
	}
	p, _, err := fleet.StartProc("nats-server", bin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mport)}, "", 0)
	if err != nil {
		return "", err
	}
	c.nats = p
	if err := fleet.WaitHTTP(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz", mport), 15*time.Second, p); err != nil {
		return "", fmt.Errorf("nats-server did not come up: %w", err)
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", port), nil
}

// pids returns the PIDs of the processes started so far.
func (c *cell) pids() []int {
	var out []int
	for _, p := range append([]*fleet.Proc{c.haproxy, c.nats}, c.gws...) {
		if p != nil && p.Started() {
			out = append(out, p.PID())
		}
	}
	return out
}

// stop ends HAProxy (so no connection holds a gateway's drain), then the gateways side by side, then
// the engines. It may be called on a partial cell and more than once.
func (c *cell) stop() {
	c.haproxy.Stop()
	var wg sync.WaitGroup
	for _, p := range c.gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Stop()
		}()
	}
	for _, e := range c.sims {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.Stop()
		}()
	}
	wg.Wait()
	c.nats.Stop() // after the gateways: none of them logs a lost connection while it drains
	c.sims = nil
}

// gatewayConfig is the gateway config of the routing report (fleet.Config: `rolter up`'s shape) with a
// short drain, so a stopped gateway exits at once.
func gatewayConfig(listen, strategy string, urls, kv []string, model string) string {
	return strings.Replace(fleet.Config(listen, strategy, urls, kv, model), "[server]\n", "[server]\ndrain_secs = 2\n", 1)
}
