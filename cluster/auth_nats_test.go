package cluster_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/rolter-ai/rolter/cluster"
	"github.com/rolter-ai/rolter/cluster/natstest"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
)

// joinWith starts a cluster on url with the NATS settings of auth, logging into logs; it is closed at
// cleanup.
func joinWith(t *testing.T, url string, auth config.ClusterConfig, logs *lockedBuffer) *cluster.Cluster {
	t.Helper()
	cfg := auth
	cfg.NATSURL, cfg.Subject, cfg.PublishIntervalMs, cfg.MaxEntries = url, "t", 20, 1024
	c, err := cluster.Start(cfg, egress.DefaultConfig(), &stubGateway{}, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// neverConnects checks that c stays disconnected for a while and that its log says why.
func neverConnects(t *testing.T, c *cluster.Cluster, logs *lockedBuffer, want string) {
	t.Helper()
	waitFor(t, "the reason in the log", func() bool { return strings.Contains(logs.String(), want) })
	time.Sleep(300 * time.Millisecond)
	if c.Stats().Connected {
		t.Fatalf("connected with the wrong credentials; log:\n%s", logs.String())
	}
}

func TestNATSAuth(t *testing.T) {
	// A server that requires credentials: the right ones connect, wrong or missing ones are refused, and
	// the log says the credentials are the reason, not the network.
	t.Setenv("TEST_NATS_USER", "gw")
	t.Setenv("TEST_NATS_PASSWORD", "s3cret pass")
	t.Setenv("TEST_NATS_WRONG", "wrong")
	t.Setenv("TEST_NATS_TOKEN", "t0ken-of-the-fleet")
	const refused = "NATS refuses this replica's credentials"

	t.Run("user and password", func(t *testing.T) {
		ns := natstest.NewWithConfig(t, "authorization {\n  user: gw\n  password: \"s3cret pass\"\n}\n")
		var ok, bad, none lockedBuffer
		c := joinWith(t, ns.URL(), config.ClusterConfig{UserEnv: "TEST_NATS_USER", PasswordEnv: "TEST_NATS_PASSWORD"}, &ok)
		waitFor(t, "connected", func() bool { return c.Stats().Connected })
		neverConnects(t, joinWith(t, ns.URL(), config.ClusterConfig{UserEnv: "TEST_NATS_USER", PasswordEnv: "TEST_NATS_WRONG"}, &bad), &bad, refused)
		neverConnects(t, joinWith(t, ns.URL(), config.ClusterConfig{}, &none), &none, refused)
	})
	t.Run("token", func(t *testing.T) {
		ns := natstest.NewWithConfig(t, "authorization {\n  token: \"t0ken-of-the-fleet\"\n}\n")
		var ok, bad lockedBuffer
		c := joinWith(t, ns.URL(), config.ClusterConfig{TokenEnv: "TEST_NATS_TOKEN"}, &ok)
		waitFor(t, "connected", func() bool { return c.Stats().Connected })
		neverConnects(t, joinWith(t, ns.URL(), config.ClusterConfig{TokenEnv: "TEST_NATS_WRONG"}, &bad), &bad, refused)
	})
	t.Run("nkey", func(t *testing.T) {
		dir := t.TempDir()
		user, other := nkeyUser(t, dir, "user.nk"), nkeyUser(t, dir, "other.nk")
		ns := natstest.NewWithConfig(t, fmt.Sprintf("authorization {\n  users: [ { nkey: %s } ]\n}\n", user.pub))
		var ok, bad lockedBuffer
		c := joinWith(t, ns.URL(), config.ClusterConfig{NKeySeedFile: user.seedFile}, &ok)
		waitFor(t, "connected", func() bool { return c.Stats().Connected })
		neverConnects(t, joinWith(t, ns.URL(), config.ClusterConfig{NKeySeedFile: other.seedFile}, &bad), &bad, refused)
	})
	t.Run("tls", func(t *testing.T) {
		dir := t.TempDir()
		pki := newPKI(t, dir)
		ns := natstest.NewWithConfig(t, fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: true\n}\n",
			pki.serverCert, pki.serverKey, pki.ca))
		url := "tls://127.0.0.1:" + fmt.Sprint(ns.Port())
		var ok, noCert, noCA lockedBuffer
		c := joinWith(t, url, config.ClusterConfig{TLSCAFile: pki.ca, TLSCertFile: pki.clientCert, TLSKeyFile: pki.clientKey}, &ok)
		waitFor(t, "connected over TLS", func() bool { return c.Stats().Connected })
		if !c.Stats().Connected || !strings.Contains(ok.String(), "tls://127.0.0.1") {
			t.Fatalf("log:\n%s", ok.String())
		}
		// Without a client certificate the server refuses; without the CA this replica refuses the server.
		neverConnects(t, joinWith(t, url, config.ClusterConfig{TLSCAFile: pki.ca}, &noCert), &noCert, "cannot reach NATS")
		neverConnects(t, joinWith(t, url, config.ClusterConfig{TLSCertFile: pki.clientCert, TLSKeyFile: pki.clientKey}, &noCA),
			&noCA, "certificate")
	})
}

type nkeyFiles struct{ pub, seedFile string }

// nkeyUser makes an NKey user and writes its seed to dir/name.
func nkeyUser(t *testing.T, dir, name string) nkeyFiles {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return nkeyFiles{pub: pub, seedFile: path}
}

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a client certificate, as PEM files.
type pki struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := pki{ca: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.ca, "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, ips []net.IP) (certFile, keyFile string) {
		key := newKey(t)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: ips,
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(t, certFile, "CERTIFICATE", der)
		writePEM(t, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	p.clientCert, p.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// rawClient is a third NATS client on the server, the attacker of the tests below.
func rawClient(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
