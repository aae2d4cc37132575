package main

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"k8s.io/klog/v2"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/discovery/dnssrc"
	"github.com/rolter-ai/rolter/discovery/kubesrc"
	"github.com/rolter-ai/rolter/engine"
)

// gateway is the gateway behind its discovery fleet: every config it runs, at start and on reload,
// from the file or the control plane, reaches it through the fleet, expanded with the endpoints of the
// config's sources.
type gateway struct {
	g          *engine.Gateway
	fleet      *discovery.Fleet
	unregister func()
}

// newGateway starts the sources of run, waits for their first sets, and creates the gateway with run
// expanded.
func newGateway(run *config.Config, log *slog.Logger) (*gateway, error) {
	var fleet *discovery.Fleet
	fleet = discovery.New(discovery.Options{Logger: log, NewWatcher: func(sc *config.SourceConfig) (discovery.Watcher, error) {
		return newWatcher(sc, fleet, log)
	}})
	expanded, err := fleet.Prepare(run)
	if err != nil {
		fleet.Close()
		return nil, err
	}
	g, err := engine.New(expanded, engine.Options{Logger: log, Version: version})
	if err != nil {
		fleet.Close()
		return nil, err
	}
	fleet.Attach(g.Reload)
	return &gateway{g: g, fleet: fleet, unregister: fleet.RegisterMetrics()}, nil
}

// newWatcher makes the watcher of one source, by its kind.
// The DNS server is reached, and the addresses it answers checked, under the fleet's [egress] policy.
func newWatcher(sc *config.SourceConfig, fleet *discovery.Fleet, log *slog.Logger) (discovery.Watcher, error) {
	if sc.Kind == config.SourceKubernetes {
		// client-go reports what it retries through klog: into the gateway's log, in its format.
		klogOnce.Do(func() { klog.SetSlogLogger(log.With("component", "client-go")) })
	}
	log = log.With("source", sc.Name)
	switch sc.Kind {
	case config.SourceKubernetes:
		return kubesrc.New(sc, kubesrc.Options{Logger: log})
	case config.SourceDNS:
		return dnssrc.New(sc, dnssrc.Options{Logger: log, Dial: fleet.Dial, Check: fleet.Check})
	}
	return nil, fmt.Errorf("unknown source kind %q", sc.Kind)
}

var klogOnce sync.Once

// apply applies cfg through the fleet (the control plane's Apply).
func (fg *gateway) apply(cfg *config.Config) error { return fg.fleet.Apply(cfg) }

// reloadFile is SIGHUP without a control plane: the file is read again and applied. What is refused is
// logged (the gateway logs its own refusals; the fleet's, a source that cannot start, are logged here).
func (fg *gateway) reloadFile(path string) {
	cfg, err := config.Load(path)
	if err == nil {
		err = fg.fleet.Apply(cfg)
		var se *discovery.StartError
		if !errors.As(err, &se) {
			return
		}
	}
	fg.g.RefuseReload(path, err)
}

// close stops the sources, after the gateway drained.
func (fg *gateway) close() {
	fg.unregister()
	fg.fleet.Close()
}
