// Package kubetest runs a real Kubernetes control plane for tests, as controller-runtime's envtest does:
// etcd and kube-apiserver on loopback, with no controller manager, scheduler or kubelet. What those would
// write (a pod's IP and Ready condition, a Service's EndpointSlices) a test writes itself, with the
// helpers here.
//
// kube-apiserver comes from $ROLTER_KUBE_APISERVER (make kube-apiserver builds it from the nested module
// internal/tools/kubeapiserver), etcd from $ROLTER_ETCD, PATH or Debian's etcd-server package. Without
// either a test skips, unless ROLTER_REQUIRE_KUBE=1 (make test sets it), when it fails.
//
// The API server authenticates bearer tokens (--token-auth-file) and authorizes with RBAC: the admin is
// in system:masters, ReaderUser has what Reader binds to it in a namespace, NobodyUser has nothing.
package kubetest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/rolter-ai/rolter/internal/freeport"
)

// Environment variables of the harness.
const (
	// APIServerEnv points at the kube-apiserver binary.
	APIServerEnv = "ROLTER_KUBE_APISERVER"
	// RequireEnv set to 1 turns a skip for want of a binary into a failure.
	RequireEnv = "ROLTER_REQUIRE_KUBE"
)

// Users the API server knows, each by a bearer token of its own.
const (
	AdminUser  = "kubetest-admin"  // in group system:masters: may do anything
	ReaderUser = "kubetest-reader" // has the Roles Reader binds to it
	NobodyUser = "kubetest-nobody" // is bound to nothing: only what every authenticated user may do
)

// serviceCIDR is the cluster's --service-cluster-ip-range; pods' IPs in tests come from elsewhere.
const serviceCIDR = "10.96.0.0/24"

// Cluster is one etcd and one kube-apiserver. Its methods are safe for concurrent use.
type Cluster struct {
	dir     string
	etcd    *process
	apiBin  string
	apiArgs []string
	host    string // https://127.0.0.1:<port>
	caPEM   []byte
	tokens  map[string]string // user -> bearer token

	// Clientset and Dynamic act as the admin.
	Clientset *kubernetes.Clientset
	Dynamic   *dynamic.DynamicClient
	// StartTime is how long the cluster took to start: etcd healthy, then kube-apiserver's /readyz ok.
	StartTime time.Duration

	stopOnce sync.Once
	mu       sync.Mutex
	api      *process // nil while stopped
}

// errNoBinaries says why the harness cannot run.
var errNoBinaries = errors.New("no kube-apiserver or etcd")

// binaries finds kube-apiserver and etcd, or says which is missing (wrapping errNoBinaries).
func binaries() (apiserver, etcd string, err error) {
	apiserver = os.Getenv(APIServerEnv)
	if apiserver == "" {
		return "", "", fmt.Errorf("%w: %s is not set (make kube-apiserver builds one)", errNoBinaries, APIServerEnv)
	}
	if _, err := os.Stat(apiserver); err != nil {
		return "", "", fmt.Errorf("%w: %s=%q: %v (make kube-apiserver builds it)", errNoBinaries, APIServerEnv, apiserver, err)
	}
	if etcd = etcdBinary(); etcd == "" {
		return "", "", fmt.Errorf("%w: no etcd on PATH and %s is not set (install Debian's etcd-server)", errNoBinaries, EtcdEnv)
	}
	if _, err := os.Stat(etcd); err != nil {
		return "", "", fmt.Errorf("%w: etcd %q: %v", errNoBinaries, etcd, err)
	}
	return apiserver, etcd, nil
}

// skipOrFail ends t for want of binaries: a skip, or a failure under ROLTER_REQUIRE_KUBE=1.
func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s=1 but %v", RequireEnv, err)
	}
	t.Skip(err)
}

// Start starts a cluster of the test's own, stopped at its cleanup. Most tests share one (Shared): a
// cluster takes seconds to start.
func Start(t testing.TB) *Cluster {
	t.Helper()
	apiserver, etcd, err := binaries()
	if err != nil {
		skipOrFail(t, err)
	}
	c, err := start(t.TempDir(), apiserver, etcd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.stop)
	t.Logf("kubetest: cluster started in %s", c.StartTime.Round(time.Millisecond))
	return c
}

// shared is the cluster of the tests that share one, started on first use and stopped by StopShared.
var shared struct {
	once sync.Once
	c    *Cluster
	dir  string
	err  error
}

// Shared returns the test binary's shared cluster, starting it on first use. Call StopShared from TestMain
// after m.Run; a binary that does not still leaves no process behind (they die with it) but leaves its
// directory in $TMPDIR.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	apiserver, etcd, err := binaries()
	if err != nil {
		skipOrFail(t, err)
	}
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "rolter-kubetest-"); shared.err != nil {
			return
		}
		shared.c, shared.err = start(shared.dir, apiserver, etcd)
		if shared.err == nil {
			t.Logf("kubetest: shared cluster started in %s", shared.c.StartTime.Round(time.Millisecond))
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.c
}

// StopShared stops the shared cluster, if one started, and removes its directory.
func StopShared() {
	if shared.c != nil {
		shared.c.stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

// start runs etcd and kube-apiserver with their files in dir, and waits until the API server is ready.
func start(dir, apiserverBin, etcdBin string) (*Cluster, error) {
	begin := time.Now()
	c := &Cluster{dir: dir, tokens: map[string]string{}}
	for _, u := range []string{AdminUser, ReaderUser, NobodyUser} {
		c.tokens[u] = newToken()
	}
	p, err := writePKI(dir)
	if err != nil {
		return nil, err
	}
	c.caPEM = p.caPEM
	tokenFile, err := c.writeTokenFile()
	if err != nil {
		return nil, err
	}
	var etcdURL string
	if c.etcd, etcdURL, err = startEtcd(dir, etcdBin); err != nil {
		return nil, err
	}
	port, err := freeport.Loopback()
	if err != nil {
		c.stop()
		return nil, err
	}
	c.host = "https://127.0.0.1:" + strconv.Itoa(port)
	c.apiBin = apiserverBin
	c.apiArgs = []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + p.servingCrt, "--tls-private-key-file=" + p.servingKey,
		"--token-auth-file=" + tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + p.saKey, "--service-account-signing-key-file=" + p.saKey,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + serviceCIDR,
		// Pods need no service account token: no controller makes the service accounts.
		"--disable-admission-plugins=ServiceAccount",
	}
	if err := c.startAPIServer(); err != nil {
		c.stop()
		return nil, err
	}
	cfg := c.Config()
	if c.Clientset, err = kubernetes.NewForConfig(cfg); err != nil {
		c.stop()
		return nil, err
	}
	if c.Dynamic, err = dynamic.NewForConfig(cfg); err != nil {
		c.stop()
		return nil, err
	}
	c.StartTime = time.Since(begin)
	return c, nil
}

// startAPIServer starts kube-apiserver and waits until it is ready.
func (c *Cluster) startAPIServer() error {
	p, err := startProcess(c.dir, "kube-apiserver", c.apiBin, c.apiArgs...)
	if err != nil {
		return err
	}
	if err := p.waitFor(90*time.Second, c.ready); err != nil {
		p.stop(time.Second)
		return err
	}
	c.mu.Lock()
	c.api = p
	c.mu.Unlock()
	return nil
}

// StopAPIServer stops kube-apiserver, as an outage of the control plane does; etcd keeps the cluster's
// objects. Not for the shared cluster.
func (c *Cluster) StopAPIServer(t testing.TB) {
	t.Helper()
	c.mu.Lock()
	p := c.api
	c.api = nil
	c.mu.Unlock()
	if p == nil {
		t.Fatal("BUG: kube-apiserver is not running")
	}
	p.stop(10 * time.Second)
}

// StartAPIServer starts kube-apiserver again on its port after StopAPIServer, and waits until it is
// ready.
func (c *Cluster) StartAPIServer(t testing.TB) {
	t.Helper()
	if err := c.startAPIServer(); err != nil {
		t.Fatal(err)
	}
}

// writeTokenFile writes the users' tokens in --token-auth-file's CSV: token,user,uid,"group,...".
func (c *Cluster) writeTokenFile() (string, error) {
	var b strings.Builder
	for _, u := range []string{AdminUser, ReaderUser, NobodyUser} {
		groups := ""
		if u == AdminUser {
			groups = `,"system:masters"`
		}
		fmt.Fprintf(&b, "%s,%s,%s%s\n", c.tokens[u], u, u, groups)
	}
	path := filepath.Join(c.dir, "tokens.csv")
	return path, os.WriteFile(path, []byte(b.String()), 0o600)
}

// ready reports whether the API server answers its /readyz with ok: storage, RBAC's bootstrap roles and
// the CRD machinery are up.
func (c *Cluster) ready() bool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.host+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+c.tokens[AdminUser])
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stop ends kube-apiserver, then etcd.
func (c *Cluster) stop() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		api := c.api
		c.api = nil
		c.mu.Unlock()
		if api != nil {
			api.stop(10 * time.Second)
		}
		if c.etcd != nil {
			c.etcd.stop(5 * time.Second)
		}
	})
}

// Host is the API server's URL.
func (c *Cluster) Host() string { return c.host }

// Config is a new client config of the admin.
func (c *Cluster) Config() *rest.Config { return c.UserConfig(AdminUser) }

// UserConfig is a new client config of user, one of AdminUser, ReaderUser and NobodyUser.
func (c *Cluster) UserConfig(user string) *rest.Config {
	token, ok := c.tokens[user]
	if !ok {
		panic(fmt.Sprintf("BUG: kubetest has no user %q", user))
	}
	return &rest.Config{
		Host:            c.host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		// Tests make many objects quickly; client-go's default of 5 per second would pace them.
		QPS: 200, Burst: 400,
	}
}
