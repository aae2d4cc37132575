package certfile

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA signs leaf certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1000), Subject: pkix.Name{CommonName: "certfile test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: k, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// leaf returns a certificate with serial n for 127.0.0.1 (server and client use) and its key, PEM.
func (ca *testCA) leaf(t *testing.T, n int64) (cert, key []byte) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(n), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// write writes b to path through a rename, as a rotation does.
func write(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// serve serves TLS with conf on loopback until the test ends, completing each handshake and closing.
func serve(t *testing.T, conf *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				var b [1]byte
				_, _ = c.Read(b[:])
			}()
		}
	}()
	return ln.Addr().String()
}

// dial connects to addr trusting ca (with the client certificate, if any) and returns the server's serial.
func dial(addr string, ca *testCA, client []tls.Certificate) (int64, error) {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{RootCAs: pool, Certificates: client, MinVersion: tls.VersionTLS12})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	// TLS 1.3: a refused client certificate is reported by the server's alert, read after the handshake.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil && !os.IsTimeout(err) && !strings.Contains(err.Error(), "EOF") {
		return 0, err
	}
	return c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(), nil
}

type files struct{ cert, key, ca string }

func writePair(t *testing.T, dir string, ca *testCA, n int64) files {
	t.Helper()
	cert, key := ca.leaf(t, n)
	f := files{filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")}
	write(t, f.cert, cert)
	write(t, f.key, key)
	return f
}

func wantSerial(t *testing.T, addr string, ca *testCA, want int64) {
	t.Helper()
	got, err := dial(addr, ca, nil)
	if err != nil {
		t.Fatalf("cannot connect: %s", err)
	}
	if got != want {
		t.Fatalf("serial %d, want %d", got, want)
	}
}

// TestRotationOnReload: a pair overwritten on disk is served to the next connection after Reload.
func TestRotationOnReload(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	f := writePair(t, dir, ca, 1)
	p, err := Open(f.cert, f.key, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p.Config(tls.VersionTLS12, []string{"http/1.1"}))
	wantSerial(t, addr, ca, 1)
	writePair(t, dir, ca, 2)
	wantSerial(t, addr, ca, 1) // no poll started, no Reload yet
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	wantSerial(t, addr, ca, 2)
}

// TestRotationOnPoll: a started Pair sees the files change by itself.
func TestRotationOnPoll(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	f := writePair(t, dir, ca, 1)
	p, err := Open(f.cert, f.key, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	p.Start(20 * time.Millisecond)
	defer p.Stop()
	addr := serve(t, p.Config(tls.VersionTLS13, nil))
	wantSerial(t, addr, ca, 1)
	writePair(t, dir, ca, 2)
	deadline := time.Now().Add(10 * time.Second)
	for p.Certificate().SerialNumber.Int64() != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the poll never loaded the new pair")
		}
		time.Sleep(10 * time.Millisecond)
	}
	wantSerial(t, addr, ca, 2)
}

// TestBadFilesKeepThePair: broken, missing or mismatched new files leave the served pair as it was, and
// a good pair afterwards is taken.
func TestBadFilesKeepThePair(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	f := writePair(t, dir, ca, 1)
	p, err := Open(f.cert, f.key, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p.Config(tls.VersionTLS12, nil))
	fail := func(name string, change func(), wantErr string) {
		t.Helper()
		change()
		err := p.Reload()
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("%s: Reload: %v, want an error with %q", name, err, wantErr)
		}
		wantSerial(t, addr, ca, 1)
	}
	_, otherKey := ca.leaf(t, 3)
	newCert, _ := ca.leaf(t, 4)
	fail("garbage cert", func() { write(t, f.cert, []byte("not a certificate")) }, "cannot load the key pair")
	fail("missing key", func() { writePair(t, dir, ca, 1); os.Remove(f.key) }, "no such file")
	fail("key mismatch", func() { writePair(t, dir, ca, 1); write(t, f.key, otherKey) }, "private key does not match")
	fail("new cert, old key", func() { writePair(t, dir, ca, 1); write(t, f.cert, newCert) }, "private key does not match")
	writePair(t, dir, ca, 5)
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	wantSerial(t, addr, ca, 5)
}

// TestOpenRefusesBadFiles: a pair that does not load at start is an error, not an empty server.
func TestOpenRefusesBadFiles(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	f := writePair(t, dir, ca, 1)
	_, otherKey := ca.leaf(t, 2)
	write(t, f.key, otherKey)
	if _, err := Open(f.cert, f.key, "", nil); err == nil || !strings.Contains(err.Error(), "private key does not match") {
		t.Fatalf("Open with a mismatched key: %v", err)
	}
	writePair(t, dir, ca, 1)
	write(t, f.ca, []byte("no pem"))
	if _, err := Open(f.cert, f.key, f.ca, nil); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("Open with a bad CA file: %v", err)
	}
}

// TestClientCertificates: with a CA file the handshake needs a client certificate that CA signed, and a
// new CA file is used by the next handshake.
func TestClientCertificates(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	dir := t.TempDir()
	f := writePair(t, dir, ca, 1)
	write(t, f.ca, ca.pem)
	p, err := Open(f.cert, f.key, f.ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, p.Config(tls.VersionTLS12, nil))
	pair := func(c *testCA, n int64) []tls.Certificate {
		cert, key := c.leaf(t, n)
		kp, err := tls.X509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{kp}
	}
	f1 := func(client []tls.Certificate, ok bool) {
		t.Helper()
		_, err := dial(addr, ca, client)
		if (err == nil) != ok {
			t.Fatalf("handshake: %v, want ok=%v", err, ok)
		}
	}
	f1(nil, false)
	f1(pair(ca, 10), true)
	f1(pair(other, 11), false)
	write(t, f.ca, other.pem)
	if err := p.Reload(); err != nil {
		t.Fatal(err)
	}
	f1(pair(other, 12), true)
	f1(pair(ca, 13), false)
}
