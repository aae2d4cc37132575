package kubetest

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
)

// EtcdEnv names the environment variable that points at an etcd binary; without it the harness looks
// for etcd on PATH and where Debian's etcd-server package puts it.
const EtcdEnv = "ROLTER_ETCD"

// etcdBinary finds etcd, "" when there is none.
func etcdBinary() string {
	if p := os.Getenv(EtcdEnv); p != "" {
		return p
	}
	if p, err := exec.LookPath("etcd"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/etcd"); err == nil {
		return "/usr/bin/etcd"
	}
	return ""
}

// startEtcd starts a one-member etcd on loopback with its data in dir/etcd and returns it with its client
// URL, once it reports itself healthy.
func startEtcd(dir, bin string) (*process, string, error) {
	clientPort, err := freeport.Loopback()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freeport.Loopback()
	if err != nil {
		return nil, "", err
	}
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", clientPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	p, err := startProcess(dir, "etcd", bin,
		"--name=kubetest",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+clientURL, "--advertise-client-urls="+clientURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=kubetest="+peerURL,
		"--log-level=warn", "--logger=zap", "--log-outputs=stderr")
	if err != nil {
		return nil, "", err
	}
	client := &http.Client{Timeout: time.Second}
	if err := p.waitFor(30*time.Second, func() bool { return etcdHealthy(client, clientURL) }); err != nil {
		p.stop(time.Second)
		return nil, "", err
	}
	return p, clientURL, nil
}

// etcdHealthy reports whether etcd at url answers its /health as healthy.
func etcdHealthy(client *http.Client, url string) bool {
	resp, err := client.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"health":"true"`)
}
