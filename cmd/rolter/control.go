package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/certfile"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/engine"
)

// controlPlane is `rolter serve`'s control plane ([control] enabled): the store, the /api/v1 server on its
// own listener, and the live file config the server composes with the store.
type controlPlane struct {
	store  *store.Store
	srv    *control.Server
	follow *control.Follower
	usage  *control.UsageFlusher
	http   *http.Server
	ln     net.Listener
	certs  *certfile.Pair // nil without [control] tls_cert_file
	file   atomic.Pointer[config.Config]
	gen    int64 // the store generation the gateway started with
	log    *slog.Logger
}

// openControl opens the store and returns the config to start the gateway with: the file's composed with
// the store's orgs. Nothing listens yet (start does that, once the gateway exists).
func openControl(file *config.Config, log *slog.Logger) (*controlPlane, *config.Config, error) {
	db, err := store.Open(file.Control.Store)
	if err != nil {
		return nil, nil, err
	}
	if err := useSecretsKey(db, file.Control.SecretsKeyEnv); err != nil {
		db.Close()
		return nil, nil, err
	}
	st, err := db.Load(context.Background())
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	cfg, _, err := control.Compose(file, st)
	if err == nil {
		if errs := config.Validate(cfg); len(errs) > 0 {
			err = fmt.Errorf("the config composed with the control plane's store %s has problems:\n%w", db.Path(), errs)
		}
	}
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	cp := &controlPlane{store: db, gen: st.Generation, log: log}
	cp.file.Store(file)
	return cp, cfg, nil
}

// useSecretsKey gives the store the key of its org secrets from the environment variable env names ("":
// secrets are off).
func useSecretsKey(db *store.Store, env string) error {
	if env == "" {
		return nil
	}
	key, err := store.ParseSecretsKey(os.Getenv(env))
	if err == nil {
		err = db.UseSecretsKey(key)
	}
	if err != nil {
		return fmt.Errorf("cannot read [control] secrets_key_env %q: %w", env, err)
	}
	return nil
}

// start serves /api/v1 and the dashboard (/dashboard/) for gateway fg on [control] listen.
func (cp *controlPlane) start(fg *gateway) error {
	g := fg.g
	c := cp.file.Load().Control
	srv, err := control.NewServer(control.Options{
		Store:      cp.store,
		File:       cp.file.Load,
		Apply:      fg.apply,
		State:      g.State,
		Sources:    fg.fleet.Status,
		Metrics:    g.WriteMetrics,
		Usage:      g.DrainUsage,
		AdminToken: os.Getenv(c.AdminTokenEnv),
		Listen:     c.Listen,
		Hosts:      c.Hosts,
		Version:    version,
		Logger:     cp.log,
		Generation: cp.gen,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("cannot listen for the control plane on %s: %w", c.Listen, err)
	}
	// The listener has its own cap, set aside from the socket budget the data plane counts on.
	ln = g.ControlListener(ln)
	cp.srv, cp.ln = srv, ln
	// Every accepted change of another gateway on the same store (PostgreSQL), and anything this one
	// missed, is applied here through the same compose + Reload path.
	cp.follow = control.NewFollower(srv, control.FollowerOptions{Address: advertised(ln.Addr()), Logger: cp.log})
	cp.follow.Start()
	cp.usage = control.NewUsageFlusher(srv, control.UsageFlushInterval, cp.log)
	cp.usage.Start()
	// Every phase of a connection has a deadline, so nothing a client does or leaves undone holds one of
	// the max_conns places for long.
	cp.http = &http.Server{
		Handler:        srv.Handler(),
		ReadTimeout:    secs(c.ReadTimeoutSecs),
		WriteTimeout:   secs(c.WriteTimeoutSecs),
		IdleTimeout:    secs(c.IdleTimeoutSecs),
		MaxHeaderBytes: 64 << 10,
		// net/http's own complaints (a failed handshake, a client that sent garbage) are about one
		// connection and come as often as a scanner likes: debug lines, in the gateway's log format.
		ErrorLog: slog.NewLogLogger(cp.log.Handler(), slog.LevelDebug),
	}
	scheme := "http"
	if c.TLSCertFile != "" {
		if cp.certs, err = certfile.Open(c.TLSCertFile, c.TLSKeyFile, c.TLSClientCAFile, cp.log); err != nil {
			_ = ln.Close()
			return err
		}
		cp.certs.Start(certfile.DefaultPoll)
		cp.http.TLSConfig = cp.certs.Config(config.TLSVersion(c.TLSMinVersion), []string{"h2", "http/1.1"})
		scheme = "https"
	}
	go func() {
		var err error
		if cp.certs != nil {
			err = cp.http.ServeTLS(ln, "", "")
		} else {
			err = cp.http.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			cp.log.Error("control plane stopped", "err", err)
		}
	}()
	cp.log.Info("control plane serving", "addr", scheme+"://"+ln.Addr().String(), "store", cp.store.Path(),
		"client_certs", c.TLSClientCAFile != "", "dashboard", scheme+"://"+ln.Addr().String()+"/dashboard/")
	return nil
}

// reload is SIGHUP with a control plane: the file is read again and composed with the store under the
// server's lock, so it cannot race an API write.
func (cp *controlPlane) reload(g *engine.Gateway, path string) {
	file, err := config.Load(path)
	if err != nil {
		g.RefuseReload(path, err)
		return
	}
	prev := cp.file.Swap(file)
	if err := cp.srv.Reload(); err != nil {
		cp.file.Store(prev) // the running config is still the previous file's
		cp.log.Error("config reload refused; the running config keeps serving", "error", err.Error())
	}
}

// advertised is the control plane's address as another host reaches it: the host name for an unspecified
// (all-interfaces) IP.
func advertised(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil && h != "" {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// reloadCerts reads the control plane's certificate files again (SIGHUP); cp may be nil.
func (cp *controlPlane) reloadCerts() {
	if cp != nil && cp.certs != nil {
		_ = cp.certs.Reload() // logs why it kept the previous pair
	}
}

// stop stores the keys' last usage, stops following the store, closes the listener and the store, after
// the gateway drained.
func (cp *controlPlane) stop() {
	if cp.usage != nil {
		cp.usage.Stop()
	}
	if cp.follow != nil {
		cp.follow.Stop()
	}
	if cp.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = cp.http.Shutdown(ctx)
	}
	if cp.certs != nil {
		cp.certs.Stop()
	}
	if err := cp.store.Close(); err != nil {
		cp.log.Error("cannot close the control plane's store", "err", err)
	}
}

// secs is a config duration in seconds.
func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
