package main

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/testpki"
)

// TestServeTLS runs `rolter serve` with TLS on both listeners and client certificates on the control plane,
// and drives it with real TLS clients: curl and the OpenAI Node SDK (trusting the test CA through
// NODE_EXTRA_CA_CERTS) on the data plane, curl with and without a client certificate on the control plane.
// Then the certificates rotate under the running process: on SIGHUP (a change the poll cannot see), on the
// poll without a signal, and a broken file keeps the pair that serves. A connection made before a rotation keeps working.
func TestServeTLS(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed")
	}
	pki := testpki.New(t)
	dataCert, dataKey := pki.Issue("data", 10, false)
	ctlCert, ctlKey := pki.Issue("control", 20, false)
	clientCert, clientKey := pki.Issue("operator", 30, true)

	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := http.Server{Handler: http.HandlerFunc(chatUpstream)}
	go up.Serve(upLn)
	defer up.Close()

	addr, ctl := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "serve.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`[server]
listen = %q
drain_secs = 2
read_timeout_secs = 1
tls_cert_file = %q
tls_key_file = %q
[control]
enabled = true
listen = %q
store = %q
admin_token_env = "ROLTER_TEST_ADMIN"
tls_cert_file = %q
tls_key_file = %q
tls_client_ca_file = %q
[[providers]]
name = "a"
api_base = "http://%s"
[[routes]]
model = "m"
[[routes.targets]]
provider = "a"
`, addr, dataCert, dataKey, ctl, filepath.Join(dir, "rolter.db"), ctlCert, ctlKey, pki.CA(), upLn.Addr())), 0o600)
	t.Setenv("ROLTER_TEST_ADMIN", "root-secret")
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "-config", cfg, "-log-level", "error"}, io.Discard, io.Discard) }()
	defer func() {
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("serve exited %d", code)
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not exit after SIGTERM")
		}
	}()
	client := &tls.Config{RootCAs: pki.Pool}
	waitFor(t, "the data plane's TLS listener", func() bool { return servedSerial(addr, client) == 10 })

	chat := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	out, err := exec.Command(curl, "-sS", "--cacert", pki.CA(), "-H", "Content-Type: application/json", "-d", chat,
		"-w", "\n%{http_code} %{scheme}", "https://"+addr+"/v1/chat/completions").CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\n200 HTTPS") || !strings.Contains(string(out), "Hello there") {
		t.Fatalf("curl over TLS to the data plane: %v\n%s", err, out)
	}
	if out, err := exec.Command(curl, "-sS", "--max-time", "5", "http://"+addr+"/v1/models").CombinedOutput(); err == nil {
		t.Fatalf("plain HTTP on the TLS listener was answered: %s", out)
	}
	nodeSDKOverTLS(t, "https://"+addr+"/v1", pki.CA())

	// A client that connects and never starts its handshake is closed by the read timeout (1 s here).
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Fatalf("a connection without a handshake was not closed by the gateway: %v", err)
	}
	silent.Close()

	state := "https://" + ctl + "/api/v1/state"
	out, err = exec.Command(curl, "-sS", "--max-time", "5", "--cacert", pki.CA(), "-H", "Authorization: Bearer root-secret",
		"-w", "\n%{http_code}", state).CombinedOutput()
	if err == nil {
		t.Fatalf("the control plane answered a client without a certificate: %s", out)
	}
	out, err = exec.Command(curl, "-sS", "--max-time", "5", "--cacert", pki.CA(), "--cert", clientCert, "--key", clientKey,
		"-H", "Authorization: Bearer root-secret", "-w", "\n%{http_code}", state).CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\n200") {
		t.Fatalf("curl with a client certificate to the control plane: %v\n%s", err, out)
	}
	operator, err := tls.LoadX509KeyPair(clientCert, clientKey)
	if err != nil {
		t.Fatal(err)
	}
	ctlClient := &tls.Config{RootCAs: pki.Pool, Certificates: []tls.Certificate{operator}}
	if got := servedSerial(ctl, ctlClient); got != 20 {
		t.Fatalf("control plane serves serial %d, want 20", got)
	}
	// The dashboard's own writes over TLS: a browser sends its https origin.
	out, err = exec.Command(curl, "-sS", "--max-time", "5", "--cacert", pki.CA(), "--cert", clientCert, "--key", clientKey,
		"-H", "Authorization: Bearer root-secret", "-H", "Origin: https://"+ctl, "-H", "Sec-Fetch-Site: same-origin",
		"-H", "Content-Type: application/json", "-d", `{"name":"team"}`, "-w", "\n%{http_code}", "https://"+ctl+"/api/v1/orgs").CombinedOutput()
	if err != nil || !strings.HasSuffix(string(out), "\n201") {
		t.Fatalf("a same-origin write over TLS: %v\n%s", err, out)
	}

	// A keep-alive connection made before the rotation.
	keep := &http.Client{Transport: &http.Transport{TLSClientConfig: client.Clone()}, Timeout: 5 * time.Second}
	if serial, _ := chatOver(t, keep, addr, chat); serial != 10 {
		t.Fatalf("first keep-alive request served serial %d", serial)
	}

	// In place, sizes and times kept: the poll cannot see it, SIGHUP reads the files again.
	pki.Overwrite("data", 11)
	pki.Overwrite("control", 21)
	time.Sleep(3 * time.Second) // longer than the poll
	if got := servedSerial(addr, client); got != 10 {
		t.Fatalf("before SIGHUP the data plane serves serial %d, want 10 (the poll should not see this change)", got)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitFor(t, "the data plane's certificate after SIGHUP", func() bool { return servedSerial(addr, client) == 11 })
	waitFor(t, "the control plane's certificate after SIGHUP", func() bool { return servedSerial(ctl, ctlClient) == 21 })
	if serial, reused := chatOver(t, keep, addr, chat); serial != 10 || !reused {
		t.Fatalf("the connection made before SIGHUP: serial %d, reused %v; want 10 on the same connection", serial, reused)
	}

	pki.Issue("data", 12, false) // no signal: the poll finds it
	waitFor(t, "the data plane's certificate after a change without a signal", func() bool { return servedSerial(addr, client) == 12 })

	os.WriteFile(dataCert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	time.Sleep(3 * time.Second) // longer than the poll
	if got := servedSerial(addr, client); got != 12 {
		t.Fatalf("after a broken certificate file the data plane serves serial %d, want 12 still", got)
	}
	fresh := &http.Client{Transport: &http.Transport{TLSClientConfig: client.Clone()}, Timeout: 5 * time.Second}
	if serial, _ := chatOver(t, fresh, addr, chat); serial != 12 {
		t.Fatalf("a chat after the broken file: serial %d", serial)
	}
}

// chatUpstream answers chat completions as vLLM does: JSON, or SSE with usage when stream_options asks.
func chatUpstream(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, piece := range []string{"Hello", " there"} {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", piece)
		w.(http.Flusher).Flush()
	}
	io.WriteString(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\ndata: [DONE]\n\n")
}

// nodeSDKOverTLS runs the OpenAI Node SDK (installed for engine's tests by `make deps`) against baseURL,
// trusting ca: a chat completion and a streamed one with usage.
func nodeSDKOverTLS(t *testing.T, baseURL, ca string) {
	t.Helper()
	dir, _ := filepath.Abs("../../engine/testdata/sdk")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "openai"))
	}
	if err != nil {
		if os.Getenv("ROLTER_REQUIRE_SDK") != "" {
			t.Fatalf("the OpenAI Node SDK is required (run `make deps`): %s", err)
		}
		t.Logf("OpenAI Node SDK not installed, not run: %s", err)
		return
	}
	const script = `import OpenAI from 'openai';
const client = new OpenAI({ baseURL: process.env.ROLTER_BASE, apiKey: 'sk-dummy', maxRetries: 0, timeout: 20000 });
const chat = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hello' }] });
const stream = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'hi' }],
  stream: true, stream_options: { include_usage: true } });
let text = '', usage = null;
for await (const c of stream) { text += c.choices[0]?.delta?.content ?? ''; if (c.usage) usage = c.usage; }
console.log(JSON.stringify({ chat: chat.choices[0].message.content, text, total: usage?.total_tokens }));`
	cmd := exec.Command(node, "--input-type=module", "-e", script)
	cmd.Dir = dir // the SDK is resolved from here
	cmd.Env = append(os.Environ(), "ROLTER_BASE="+baseURL, "NODE_EXTRA_CA_CERTS="+ca)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the OpenAI Node SDK over TLS: %s\n%s", err, out)
	}
	var res struct {
		Chat, Text string
		Total      int
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if json.Unmarshal([]byte(lines[len(lines)-1]), &res) != nil || res.Chat != "Hello there" || res.Text != "Hello there" || res.Total != 7 {
		t.Fatalf("the OpenAI Node SDK over TLS: %s", out)
	}
}

// servedSerial is the serial of the certificate a new TLS connection to addr is served (0 on a failure).
func servedSerial(addr string, conf *tls.Config) int64 {
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, conf)
	if err != nil {
		return 0
	}
	defer conn.Close()
	if err := conn.Handshake(); err != nil {
		return 0
	}
	return serialOf(conn.ConnectionState())
}

// chatOver sends a chat request through c and returns the serial of the certificate its connection was
// made with and whether the connection was reused.
func chatOver(t *testing.T, c *http.Client, addr, body string) (int64, bool) {
	t.Helper()
	var reused bool
	req, _ := http.NewRequest("POST", "https://"+addr+"/v1/chat/completions", strings.NewReader(body))
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused },
	}))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.TLS == nil {
		t.Fatalf("chat over TLS: %d %s", resp.StatusCode, b)
	}
	return serialOf(*resp.TLS), reused
}

func serialOf(s tls.ConnectionState) int64 {
	if len(s.PeerCertificates) == 0 {
		return 0
	}
	return s.PeerCertificates[0].SerialNumber.Int64()
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
