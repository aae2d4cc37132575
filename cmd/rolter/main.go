// Command rolter is the Rolter gateway: serve, check, sim, up, version.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/clientconn"
	"github.com/rolter-ai/rolter/cluster"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/loadtest"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Rolter: a cache-aware OpenAI-compatible gateway for vLLM fleets.

Usage:
  rolter serve [-config rolter.toml]   run the gateway; SIGHUP reloads the file, SIGTERM drains
  rolter check -config rolter.toml [-print]
                                       validate a config; print every problem; exit 1 on any;
                                       -print: print the effective config, every default filled in
  rolter sim [flags]                   run one simulated vLLM engine (rolter sim -h)
  rolter up [-n 4] [-strategy pipeline] [-control]
                                       start simulated engines and a gateway in front of them;
                                       -control: the control plane and dashboard too
  rolter loadtest [flags]              drive an OpenAI-compatible endpoint with a workload (rolter loadtest -h)
  rolter replay -trace F [flags]       replay a captured or Mooncake trace through every strategy on a
                                       simulated fleet; print the routing table (rolter replay -h)
  rolter version                       print the version
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "check":
		return check(args[1:], stdout, stderr)
	case "sim":
		return simMain(args[1:], stdout, stderr)
	case "up":
		return up(args[1:], stdout, stderr)
	case "loadtest":
		return loadtest.Main(args[1:], stdout)
	case "replay":
		return replayMain(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, "rolter", version)
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "rolter: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

// parseFlags parses a subcommand's flags. -h is asked for: the usage goes to stdout and the exit code is 0;
// a bad flag is reported with the usage on stderr and exit code 2. ok is false when the command stops here.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	fs.SetOutput(stderr)
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			fs.SetOutput(stdout)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rolter %s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return 2, false
	}
	return 0, true
}

func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	path := fs.String("config", "rolter.toml", "config file to validate")
	print := fs.Bool("print", false, "print the effective config, every default filled in")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		var ce config.Errors
		if errors.As(err, &ce) {
			fmt.Fprintf(stderr, "%s: %d problem(s)\n", *path, len(ce))
		}
		return 1
	}
	if *print {
		fmt.Fprintf(stdout, "# %s, with every default filled in\n", *path)
		if err := cfg.Effective().WriteTOML(stdout); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "%s: ok (%d providers, %d routes)\n", *path, len(cfg.Providers), len(cfg.Routes))
	return 0
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "rolter.toml", "config file")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	log := newLogger(stderr, *level)
	cfg, err := config.Load(*path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		fmt.Fprintln(stderr, "rolter: not starting: the config has problems")
		return 1
	}
	var cp *controlPlane
	run := cfg
	if cfg.Control.Enabled {
		if cp, run, err = openControl(cfg, log); err != nil {
			fmt.Fprintln(stderr, err)
			fmt.Fprintln(stderr, "rolter: not starting: the control plane cannot start")
			return 1
		}
		defer cp.stop()
	}
	ln, err := clientconn.Listen(cfg.Server.Listen)
	if err != nil {
		log.Error("cannot listen", "addr", cfg.Server.Listen, "err", err)
		return 1
	}
	certs, ln, err := listenTLS(cfg.Server, ln, log)
	if err != nil {
		log.Error("cannot serve TLS", "addr", cfg.Server.Listen, "err", err)
		return 1
	}
	defer certs.Stop()
	fg, err := newGateway(run, log)
	if err != nil {
		log.Error("cannot start the gateway", "err", err)
		return 1
	}
	defer fg.close()
	g := fg.g
	if cfg.Cluster.NATSURL != "" {
		// [cluster] is read at start: a reload does not change the NATS connection or its settings.
		cl, err := cluster.Start(cfg.Cluster, cfg.Egress, g, log)
		if err != nil {
			log.Error("cannot start the cluster", "err", err)
			_ = g.Shutdown(context.Background())
			return 1
		}
		defer cl.Close()
	}
	reload := func() { fg.reloadFile(*path) } // logs what it refused
	if cp != nil {
		if err := cp.start(fg); err != nil {
			log.Error("cannot start the control plane", "err", err)
			_ = g.Shutdown(context.Background())
			return 1
		}
		reload = func() { cp.reload(fg.g, *path) }
	}
	fileReload := reload
	reload = func() {
		certs.Reload()
		cp.reloadCerts()
		fileReload()
	}
	return serveUntilSignal(g, ln, time.Duration(cfg.Server.DrainSecs*float64(time.Second)), reload, log)
}

// serveUntilSignal serves until SIGINT or SIGTERM, then drains in-flight requests up to drain. SIGHUP calls
// reload, which re-reads the config file: a file that does not load is refused (every problem is logged)
// and the running config keeps serving.
func serveUntilSignal(g *engine.Gateway, ln net.Listener, drain time.Duration, reload func(), log *slog.Logger) int {
	// Signals are caught before the first request can be served, so none of them can kill the process.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sig)
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(ln) }()
wait:
	for {
		select {
		case err := <-errc:
			if err != nil {
				log.Error("server stopped", "err", err)
				return 1
			}
			return 0
		case s := <-sig:
			if s == syscall.SIGHUP {
				log.Info("reloading the config", "signal", s.String())
				reload()
				continue
			}
			log.Info("draining", "signal", s.String(), "deadline", drain.String())
			break wait
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		log.Error("shutdown", "err", err)
		return 1
	}
	<-errc
	return 0
}
