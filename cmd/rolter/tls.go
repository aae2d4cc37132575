package main

import (
	"crypto/tls"
	"log/slog"
	"net"

	"github.com/rolter-ai/rolter/certfile"
	"github.com/rolter-ai/rolter/config"
)

// listenTLS puts TLS over the data plane's listener ln when [server] tls_cert_file is set, and returns the
// pair that follows the files (nil, and ln as it is, without). The TLS layer is under the gateway's own
// listener (Gateway.Serve wraps what it is given): every accepted socket is admitted against the socket
// budget before its handshake, and clientconn sees the *tls.Conn and keeps its deadlines on it. HTTP/1.1
// only: fasthttp does not speak h2.
func listenTLS(s config.ServerConfig, ln net.Listener, log *slog.Logger) (*certs, net.Listener, error) {
	if s.TLSCertFile == "" {
		return nil, ln, nil
	}
	p, err := certfile.Open(s.TLSCertFile, s.TLSKeyFile, "", log)
	if err != nil {
		_ = ln.Close()
		return nil, nil, err
	}
	p.Start(certfile.DefaultPoll)
	return &certs{p}, tls.NewListener(ln, p.Config(config.TLSVersion(s.TLSMinVersion), []string{"http/1.1"})), nil
}

// certs is the data plane's pair; its methods do nothing on nil (plain HTTP).
type certs struct{ p *certfile.Pair }

func (c *certs) Reload() {
	if c != nil {
		_ = c.p.Reload() // logs why it kept the previous pair
	}
}

func (c *certs) Stop() {
	if c != nil {
		c.p.Stop()
	}
}
