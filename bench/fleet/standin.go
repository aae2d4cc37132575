package fleet

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/cluster"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
)

// StandIn lets a report's test binary stand in for bin/rolter: run as `<test binary> serve -config F`
// it serves F like `rolter serve` does and exits, so the tests need no build of cmd/rolter (which costs
// more than a test itself after an engine change). Run as anything else it returns; TestMain calls it
// first. (The scale-out test runs on a real binary when ROLTER_BIN names one.)
func StandIn() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "serve":
			os.Exit(serve(os.Args[2:]))
		case "version":
			fmt.Println("rolter test binary")
			os.Exit(0)
		}
	}
}

// serve is `rolter serve` without the control plane and reloads: it serves the config until
// SIGTERM or SIGINT, then drains for up to 2 s.
func serve(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "rolter.toml", "config file")
	fs.String("log-level", "warn", "ignored: warnings and errors are logged")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Server.Listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	g, err := engine.New(cfg, engine.Options{Logger: log, Version: "test"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if cfg.Cluster.NATSURL != "" {
		cl, err := cluster.Start(cfg.Cluster, cfg.Egress, g, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer cl.Close()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()
	select {
	case err := <-errc:
		fmt.Fprintln(os.Stderr, err)
		return 1
	case <-sig:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = g.Shutdown(ctx)
	select {
	case <-errc:
	case <-ctx.Done():
	}
	return 0
}
