// Package testpki is a throwaway certificate authority for tests that run real TLS clients and servers.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a certificate authority in a directory: ca.pem, and the leaves it issues as <name>.pem and
// <name>.key, all valid for a day.
type PKI struct {
	t    testing.TB
	dir  string
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	Pool *x509.CertPool // holds the authority's certificate
}

// New makes an authority in a temporary directory of t.
func New(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{t: t, dir: t.TempDir(), key: newKey(t)}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rolter test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.Pool = x509.NewCertPool()
	p.Pool.AddCert(p.ca)
	p.write("ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return p
}

// CA is the path of the authority's certificate.
func (p *PKI) CA() string { return filepath.Join(p.dir, "ca.pem") }

// Issue writes a leaf for 127.0.0.1 with serial into <name>.pem and <name>.key (replacing them by rename,
// as a certificate manager does) and returns their paths. client makes it a client certificate.
func (p *PKI) Issue(name string, serial int64, client bool) (cert, key string) {
	p.t.Helper()
	certPEM, keyPEM := p.leaf(name, serial, client)
	return p.write(name+".pem", certPEM), p.write(name+".key", keyPEM)
}

// Overwrite writes a new leaf for name in place, of the same sizes as the files it replaces and with their
// modification times: a change only a reload that reads the files again can see.
func (p *PKI) Overwrite(name string, serial int64) {
	p.t.Helper()
	cert, key := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+".key")
	ci, err1 := os.Stat(cert)
	ki, err2 := os.Stat(key)
	if err1 != nil || err2 != nil {
		p.t.Fatal(err1, err2)
	}
	for range 100 {
		certPEM, keyPEM := p.leaf(name, serial, false)
		if int64(len(certPEM)) != ci.Size() || int64(len(keyPEM)) != ki.Size() {
			continue // an ECDSA signature's length varies by a byte or two
		}
		for _, f := range []struct {
			path string
			b    []byte
			fi   os.FileInfo
		}{{cert, certPEM, ci}, {key, keyPEM, ki}} {
			if err := os.WriteFile(f.path, f.b, 0o600); err != nil {
				p.t.Fatal(err)
			}
			if err := os.Chtimes(f.path, f.fi.ModTime(), f.fi.ModTime()); err != nil {
				p.t.Fatal(err)
			}
		}
		return
	}
	p.t.Fatal("no leaf of the same size in 100 tries")
}

// leaf returns a PEM certificate and PKCS#8 key for 127.0.0.1, signed by the authority.
func (p *PKI) leaf(name string, serial int64, client bool) (certPEM, keyPEM []byte) {
	p.t.Helper()
	k := newKey(p.t)
	usage := x509.ExtKeyUsageServerAuth
	if client {
		usage = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.key)
	if err != nil {
		p.t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		p.t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// write replaces dir/name with b by rename.
func (p *PKI) write(name string, b []byte) string {
	p.t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path+".new", b, 0o600); err != nil {
		p.t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		p.t.Fatal(err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}
