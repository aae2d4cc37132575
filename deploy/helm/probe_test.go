package helm

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/rolter-ai/rolter/control/store/pgtest"
	"github.com/rolter-ai/rolter/internal/freeport"
	"github.com/rolter-ai/rolter/internal/testpki"
)

// The probe tests run what the chart renders against a real `rolter serve`: the rendered rolter.toml with
// only its listen addresses moved to loopback and its SQLite path into a temporary folder, the environment
// the Deployment gives (the superadmin token from the chart's Secret), and the readiness and liveness probes
// as the kubelet runs them (HTTP GET on the named container port, a success is 200-399, failureThreshold
// failures in a row fail it).

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if bin.dir != "" {
		os.RemoveAll(bin.dir)
	}
	os.Exit(code)
}

var bin struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// rolterBinary builds cmd/rolter from the repository this module sits in, once per test binary.
func rolterBinary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		if bin.dir, bin.err = os.MkdirTemp("", "rolter-chart-"); bin.err != nil {
			return
		}
		bin.path = filepath.Join(bin.dir, "rolter")
		cmd := exec.Command("go", "build", "-o", bin.path, "./cmd/rolter")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			bin.err = fmt.Errorf("go build ./cmd/rolter: %v\n%s", err, out)
		}
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

// pod is a rendered Deployment's container run as a local process.
type pod struct {
	ports map[string]int // container port name -> the loopback port it listens on here
	env   []string
	cmd   *exec.Cmd
	log   *strings.Builder
}

// secrets are the operator's Secrets a pod mounts (by name: key -> bytes); the chart does not render them.
type secrets map[string]map[string][]byte

// mountSecrets writes every Secret volume of c that s holds into a folder of dir, as the kubelet does, and
// returns toml with the mount paths moved there.
func mountSecrets(t *testing.T, m manifests, c corev1.Container, s secrets, dir, toml string) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		for _, v := range m.deployment.Spec.Template.Spec.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			data, ok := s[v.Secret.SecretName]
			if !ok {
				t.Fatalf("volume %s mounts Secret %q, which the test does not have", v.Name, v.Secret.SecretName)
			}
			local := filepath.Join(dir, v.Name)
			if err := os.MkdirAll(local, 0o700); err != nil {
				t.Fatal(err)
			}
			for k, b := range data {
				if err := os.WriteFile(filepath.Join(local, k), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			toml = strings.ReplaceAll(toml, `"`+vm.MountPath+`/`, `"`+local+`/`)
		}
	}
	return toml
}

var listenLine = regexp.MustCompile(`(?m)^listen = ":(\d+)"$`)

// startPod runs the rendered manifests' container: the ConfigMap's rolter.toml with every `listen = ":N"`
// moved to a free loopback port (remembered under the container port's name), the SQLite store in dir, the
// Secret volumes written from s.
func startPod(t *testing.T, m manifests, s secrets) *pod {
	t.Helper()
	c := m.deployment.Spec.Template.Spec.Containers[0]
	dir := t.TempDir()
	toml := m.configMap.Data["rolter.toml"]
	byPort := map[string]int{}
	toml = listenLine.ReplaceAllStringFunc(toml, func(line string) string {
		port := listenLine.FindStringSubmatch(line)[1]
		free := freePort(t)
		byPort[port] = free
		return fmt.Sprintf("listen = \"127.0.0.1:%d\"", free)
	})
	toml = strings.ReplaceAll(toml, `"/var/lib/rolter/`, `"`+dir+`/`)
	toml = mountSecrets(t, m, c, s, dir, toml)
	path := filepath.Join(dir, "rolter.toml")
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &pod{ports: map[string]int{}, log: &strings.Builder{}}
	for _, cp := range c.Ports {
		local, ok := byPort[fmt.Sprint(cp.ContainerPort)]
		if !ok {
			t.Fatalf("container port %s (%d) is not a listen address of the rendered rolter.toml:\n%s", cp.Name, cp.ContainerPort, toml)
		}
		p.ports[cp.Name] = local
	}
	p.env = append(os.Environ(), containerEnv(t, c, m)...)
	// The container's args with the config moved here; the image's entrypoint is the binary.
	args := append([]string(nil), c.Args...)
	for i, a := range args {
		if a == "/etc/rolter/rolter.toml" {
			args[i] = path
		}
	}
	p.cmd = exec.Command(rolterBinary(t), args...)
	p.cmd.Env = p.env
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if t.Failed() {
			t.Logf("rolter serve's log:\n%s", p.log)
		}
	})
	return p
}

// containerEnv resolves the container's env: literal values and the keys of the chart's own Secret
// (other Secrets, the operator's, are left out).
func containerEnv(t *testing.T, c corev1.Container, m manifests) []string {
	t.Helper()
	var env []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil && m.secret != nil && e.ValueFrom.SecretKeyRef.Name == m.secret.Name:
			v, ok := m.secret.Data[e.ValueFrom.SecretKeyRef.Key]
			if !ok {
				t.Fatalf("env %s: key %q not in Secret %s", e.Name, e.ValueFrom.SecretKeyRef.Key, m.secret.Name)
			}
			env = append(env, e.Name+"="+string(v))
		}
	}
	return env
}

func freePort(t *testing.T) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// probe runs an HTTP GET probe as the kubelet does, once: over TLS for scheme HTTPS, without verifying the
// certificate (the kubelet does not).
func (p *pod) probe(t *testing.T, pr *corev1.Probe) (int, string, error) {
	t.Helper()
	if pr == nil || pr.HTTPGet == nil {
		t.Fatalf("probe %+v: want an httpGet probe", pr)
	}
	port, ok := p.ports[pr.HTTPGet.Port.String()]
	if !ok {
		t.Fatalf("probe port %q is not a container port (%v)", pr.HTTPGet.Port.String(), p.ports)
	}
	timeout := time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	client := http.Client{Timeout: timeout}
	scheme := "http"
	if pr.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	}
	resp, err := client.Get(fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, port, pr.HTTPGet.Path))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// becomesReady runs the probe every 100 ms (the kubelet's period, shortened) until a success, for at most
// 20 s: what the pod needs to be Ready (successThreshold 1).
func (p *pod) becomesReady(t *testing.T, name string, pr *corev1.Probe) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if p.cmd.ProcessState != nil {
			break
		}
		code, body, err := p.probe(t, pr)
		if err == nil && code >= 200 && code < 400 {
			return body
		}
		last = fmt.Sprintf("%d %q %v", code, body, err)
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: the %s probe never passed; last: %s", name, pr.HTTPGet.Path, last)
	return ""
}

// TestChartProbes: the defaults (an empty gateway, providers to be added through the control plane) and
// the README's fleet install (PostgreSQL, several replicas, a providers file) render pods that become
// Ready and stay live; the control port the Service carries answers the API.
func TestChartProbes(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"llama","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer upstream.Close()

	// run renders values, starts the pod and checks its probes; control (nil: plain HTTP) is how a client
	// reaches the control port.
	run := func(name string, values map[string]any, s secrets, control *http.Client, wantReady string) *pod {
		t.Helper()
		rendered, err := render(t, values)
		if err != nil {
			t.Fatalf("%s: helm template: %v", name, err)
		}
		m := decode(t, rendered)
		c := m.deployment.Spec.Template.Spec.Containers[0]
		p := startPod(t, m, s)
		if got := p.becomesReady(t, name, c.ReadinessProbe); got != wantReady {
			t.Fatalf("%s: ready with %q, want %q", name, got, wantReady)
		}
		for i := int32(0); i < max(c.LivenessProbe.FailureThreshold, 1); i++ {
			if code, body, err := p.probe(t, c.LivenessProbe); err != nil || code != 200 {
				t.Fatalf("%s: liveness probe %d %q %v", name, code, body, err)
			}
		}
		// The control port takes the operator's first call with the chart's token.
		scheme := "https"
		if control == nil {
			scheme, control = "http", http.DefaultClient
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("%s://127.0.0.1:%d/api/v1/info", scheme, p.ports["control"]), nil)
		for _, e := range p.env {
			if tok, ok := strings.CutPrefix(e, "ROLTER_ADMIN_TOKEN="); ok {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
		}
		resp, err := control.Do(req)
		if err != nil {
			t.Fatalf("%s: control plane: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: GET /api/v1/info: %d", name, resp.StatusCode)
		}
		return p
	}

	run("defaults", nil, nil, nil, "ready: no routes yet\n")

	// TLS from cert-manager-shaped Secrets: HTTPS probes on the data port, client certificates on the
	// control port.
	pki := testpki.New(t)
	read := func(path string) []byte {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dataCert, dataKey := pki.Issue("data", 10, false)
	ctlCert, ctlKey := pki.Issue("control", 20, false)
	opCert, opKey := pki.Issue("operator", 30, true)
	operator, err := tls.LoadX509KeyPair(opCert, opKey)
	if err != nil {
		t.Fatal(err)
	}
	withTLS := map[string]any{
		"server":  map[string]any{"tls": map[string]any{"secretName": "rolter-tls"}},
		"control": map[string]any{"tls": map[string]any{"secretName": "rolter-control-tls", "clientCA": true}},
	}
	tlsSecrets := secrets{
		"rolter-tls":         {"tls.crt": read(dataCert), "tls.key": read(dataKey)},
		"rolter-control-tls": {"tls.crt": read(ctlCert), "tls.key": read(ctlKey), "ca.crt": read(pki.CA())},
	}
	withCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pki.Pool, Certificates: []tls.Certificate{operator}}}}
	tp := run("TLS", withTLS, tlsSecrets, withCert, "ready: no routes yet\n")
	noCert := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pki.Pool}}}
	if resp, err := noCert.Get(fmt.Sprintf("https://127.0.0.1:%d/api/v1/info", tp.ports["control"])); err == nil {
		resp.Body.Close()
		t.Fatalf("TLS: the control port answered a client without a certificate: %d", resp.StatusCode)
	}

	store := pgtest.Database(t)
	fleet := map[string]any{
		"replicaCount": 3,
		"control": map[string]any{
			"store":    store,
			"database": map[string]any{"passwordSecret": "rolter-db"},
		},
		"config": fmt.Sprintf("[[providers]]\nname = \"vllm-0\"\napi_base = %q\n\n[[routes]]\nmodel = \"llama\"\nstrategy = \"cache_aware\"\n[[routes.targets]]\nprovider = \"vllm-0\"\n", upstream.URL),
	}
	p := run("README fleet install", fleet, nil, nil, "ready\n")
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", p.ports["http"]), "application/json",
		strings.NewReader(`{"model":"llama","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"content":"ok"`) {
		t.Fatalf("a chat request through the fleet pod: %d %s", resp.StatusCode, b)
	}
}

// TestChartRefusesInvalidTOML: config that is not TOML, or that writes a table the chart writes itself,
// fails `helm template` with the parser's words.
func TestChartRefusesInvalidTOML(t *testing.T) {
	for name, config := range map[string]string{
		"unclosed table": "[[providers]\nname = \"a\"\n",
		"bare value":     "[[providers]]\nname = a\n",
		"own [server]":   "[server]\nlisten = \":9999\"\n",
		"own [control]":  "[control]\nenabled = false\n",
	} {
		_, err := render(t, map[string]any{"config": config})
		if err == nil || !strings.Contains(err.Error(), "rolter.toml is not valid TOML") {
			t.Errorf("%s: helm template error %v; want it refused as invalid TOML", name, err)
		}
	}
}
