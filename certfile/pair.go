package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPoll is how often a started Pair looks at its files.
const DefaultPoll = 2 * time.Second

// Pair is a key pair (and, for client-certificate auth, a CA pool) that follows its files. Its Config serves
// the current one to every new handshake; a connection keeps the certificate it was made with. Safe for
// concurrent use.
type Pair struct {
	certFile, keyFile, caFile string
	log                       *slog.Logger

	cert atomic.Pointer[tls.Certificate]
	// conf is the config a handshake gets when client certificates are required: the base config with the
	// current CA pool, made once per change of the CA file.
	conf atomic.Pointer[tls.Config]
	base *tls.Config

	mu     sync.Mutex // serializes loads
	stamps [3]stamp   // of the files as last loaded or last refused

	stop chan struct{}
	wg   sync.WaitGroup
}

// Open loads the key pair certFile and keyFile (PEM) and, when caFile is not "", the CA certificates client
// certificates must be signed by. It fails if any of them does not load: a gateway does not start with a
// certificate it cannot serve.
func Open(certFile, keyFile, caFile string, log *slog.Logger) (*Pair, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Pair{certFile: certFile, keyFile: keyFile, caFile: caFile, log: log}
	p.base = &tls.Config{GetCertificate: p.getCertificate}
	if err := p.load(p.stampNow()); err != nil {
		return nil, err
	}
	return p, nil
}

// Config returns a TLS server config serving the current pair, at least minVersion (tls.VersionTLS12 or
// 13) and offering protos by ALPN. With a CA file it requires a client certificate signed by one of its CAs
// (tls.RequireAndVerifyClientCert), the pool read as it is at each handshake. Call it once, before serving.
func (p *Pair) Config(minVersion uint16, protos []string) *tls.Config {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.base.MinVersion = minVersion
	p.base.NextProtos = protos
	if p.caFile == "" {
		return p.base
	}
	p.base.ClientAuth = tls.RequireAndVerifyClientCert
	p.setPoolLocked(p.conf.Load().ClientCAs)
	outer := p.base.Clone()
	outer.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) { return p.conf.Load(), nil }
	return outer
}

// Certificate returns the leaf certificate being served.
func (p *Pair) Certificate() *x509.Certificate { return p.cert.Load().Leaf }

func (p *Pair) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return p.cert.Load(), nil
}

// Reload reads the files again, changed or not (SIGHUP). On an error the pair served so far stays, and the
// error says why.
func (p *Pair) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.loadLocked(p.stampNow())
	if err != nil {
		p.log.Error("cannot reload the TLS certificate; the previous one keeps serving", "cert", p.certFile, "err", err)
	}
	return err
}

// Start polls the files every interval (DefaultPoll when 0) and reloads them when one changed. Stop ends it.
func (p *Pair) Start(interval time.Duration) {
	if interval <= 0 {
		interval = DefaultPoll
	}
	p.stop = make(chan struct{})
	p.wg.Add(1)
	go p.poll(interval)
}

// Stop ends the poll Start began and waits for it.
func (p *Pair) Stop() {
	if p.stop != nil {
		close(p.stop)
		p.wg.Wait()
		p.stop = nil
	}
}

func (p *Pair) poll(interval time.Duration) {
	defer p.wg.Done()
	defer func() {
		if r := recover(); r != nil {
			p.log.Error("BUG: the TLS certificate poll panicked; certificates are no longer reloaded on change", "panic", r)
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.check()
		}
	}
}

// check reloads the files if one changed since they were last looked at. A refused change is not tried
// again until the files change once more (a rotation writes the certificate and the key one after the
// other: the second write is that change), so a broken file is logged once, not at every poll.
func (p *Pair) check() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.stampNow()
	if now == p.stamps {
		return
	}
	if err := p.loadLocked(now); err != nil {
		p.log.Error("cannot reload the changed TLS certificate; the previous one keeps serving", "cert", p.certFile, "err", err)
	}
}

func (p *Pair) stampNow() [3]stamp {
	return [3]stamp{stampOf(p.certFile), stampOf(p.keyFile), stampOf(p.caFile)}
}

func (p *Pair) load(st [3]stamp) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.loadLocked(st)
}

// loadLocked loads every file and, only if all of them load, serves what they hold. st (the files' stamps
// before the read) is remembered either way.
func (p *Pair) loadLocked(st [3]stamp) error {
	p.stamps = st
	cert, err := tls.LoadX509KeyPair(p.certFile, p.keyFile)
	if err != nil {
		return fmt.Errorf("cannot load the key pair %q and %q: %w", p.certFile, p.keyFile, err)
	}
	var pool *x509.CertPool
	if p.caFile != "" {
		if pool, err = readPool(p.caFile); err != nil {
			return err
		}
	}
	prev := p.cert.Load()
	p.cert.Store(&cert)
	if prev == nil || !prev.Leaf.Equal(cert.Leaf) {
		p.log.Info("TLS certificate loaded", "cert", p.certFile, "serial", serial(cert.Leaf.SerialNumber),
			"subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if pool != nil {
		p.setPoolLocked(pool)
	}
	return nil
}

// setPoolLocked makes the config handshakes get when client certificates are required: the base with pool.
func (p *Pair) setPoolLocked(pool *x509.CertPool) {
	c := p.base.Clone()
	c.ClientCAs = pool
	p.conf.Store(c)
}

// readPool reads the PEM CA certificates of path.
func readPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read the client CA file %q: %w", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("cannot use the client CA file %q: %w", path, errNoPEM)
	}
	return pool, nil
}

var errNoPEM = errors.New("no PEM certificate in it")

// serial formats a serial number as openssl x509 -serial does (upper-case hex).
func serial(n *big.Int) string { return fmt.Sprintf("%X", n) }
