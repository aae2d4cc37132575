package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestCheckAndVersion(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:1\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"), 0o600)
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[server]\nlisten = \"nope\"\nfoo = 1\n"), 0o600)
	f := func(args []string, wantCode int, wantOut string) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != wantCode || !strings.Contains(out.String()+errb.String(), wantOut) {
			t.Fatalf("%v: code %d, output %q %q", args, code, out.String(), errb.String())
		}
	}
	f([]string{"check", "-config", good}, 0, "ok (1 providers, 1 routes)")
	f([]string{"check", "-config", bad}, 1, "bad.toml:3: server.foo: unknown key")
	f([]string{"check", "-config", bad}, 1, "bad.toml:2: server.listen")
	f([]string{"check", "-config", bad}, 1, "2 problem(s)")
	f([]string{"serve", "-config", bad}, 1, "not starting")
	f([]string{"version"}, 0, "rolter ")
	f([]string{"frobnicate"}, 2, "unknown command")
	f([]string{"check", "-config", filepath.Join(dir, "none.toml")}, 1, "cannot read config")
	f([]string{"check", "extra"}, 2, `unexpected argument "extra"`)
	f([]string{"serve", "-nope"}, 2, "flag provided but not defined")
	// Sources are checked: their kind and table, the template they make providers of, the targets naming them.
	sources := filepath.Join(dir, "sources.toml")
	os.WriteFile(sources, []byte("[[sources]]\nname = \"pool\"\nkind = \"kubernetes\"\n[sources.kubernetes]\nselector = \"app=vllm\"\n"+
		"kubeconfig = \"/nonexistent/kubeconfig\"\n[sources.provider]\napi_base = \"http://10.0.0.1:8000\"\n"+
		"[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nsource = \"poool\"\n"), 0o600)
	f([]string{"check", "-config", sources}, 1, "sources.toml:1: sources[0].port: a source of pods by selector needs the engines' port")
	f([]string{"check", "-config", sources}, 1, `sources.toml:6: sources[0].kubernetes.kubeconfig: cannot read "/nonexistent/kubeconfig"`)
	f([]string{"check", "-config", sources}, 1, "sources.toml:8: sources[0].provider.api_base: a source's api_base must hold {ip}")
	f([]string{"check", "-config", sources}, 1, `sources.toml:12: routes[0].targets[0].source: unknown source "poool"`)

	// -h is asked for: every subcommand prints its flags on stdout and exits 0.
	for _, cmd := range []string{"check", "serve", "sim", "up", "loadtest", "replay"} {
		for _, h := range []string{"-h", "--help"} {
			var out, errb bytes.Buffer
			if code := run([]string{cmd, h}, &out, &errb); code != 0 || !strings.Contains(out.String(), "-") {
				t.Errorf("rolter %s %s: exit %d, stdout %q, stderr %q", cmd, h, code, out.String(), errb.String())
			}
		}
	}
}

// TestUp runs `rolter up`, sends a request to the gateway it prints, and stops it with SIGINT.
func TestUp(t *testing.T) {
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	cfgPath := filepath.Join(t.TempDir(), "up.toml")
	go func() {
		done <- up([]string{"-n", "2", "-listen", "127.0.0.1:0", "-config-out", cfgPath, "-control", "-control-listen", "127.0.0.1:0",
			"-shadow", "pipeline,round_robin"}, pw, io.Discard)
		pw.Close()
	}()
	banner := readBanner(t, pr)
	url := regexp.MustCompile(`gateway\s+(http://\S+)/v1`).FindStringSubmatch(banner)
	if url == nil {
		t.Fatalf("no gateway URL in:\n%s", banner)
	}
	if _, err := os.Stat(cfgPath); err != nil || !strings.Contains(banner, cfgPath) {
		t.Fatalf("config not written or not shown: %v\n%s", err, banner)
	}
	// The prompt the banner suggests: its second send finds whole KV blocks cached.
	prompt, _ := json.Marshal(TryItPrompt)
	if !strings.Contains(banner, string(prompt)) {
		t.Fatalf("the banner does not suggest TryItPrompt:\n%s", banner)
	}
	body := `{"model":"sim-model","messages":[{"role":"user","content":` + string(prompt) + `}]}`
	for i := 0; i < 2; i++ {
		resp, err := http.Post(url[1]+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "chat.completion") {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		// up runs pipeline: the second identical request is scored onto the engine holding the whole prompt.
		if i == 1 && (resp.Header.Get("X-Rolter-Decision") != "score" || resp.Header.Get("X-Rolter-Prefix-Match") != "1.0000") {
			t.Fatalf("second identical request decided %s with prefix match %s", resp.Header.Get("X-Rolter-Decision"), resp.Header.Get("X-Rolter-Prefix-Match"))
		}
		var answer struct {
			Usage struct {
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		if err := json.Unmarshal(b, &answer); err != nil {
			t.Fatal(err)
		}
		if cached := answer.Usage.PromptTokensDetails.CachedTokens; (i == 1) != (cached > 0) {
			t.Fatalf("send %d: cached_tokens %d\n%s", i+1, cached, b)
		}
	}
	// -control: the dashboard and the API, with the token the banner shows.
	ctl := regexp.MustCompile(`dashboard\s+(http://\S+)/dashboard/\s+\(admin token (\w+)\)`).FindStringSubmatch(banner)
	if ctl == nil {
		t.Fatalf("no dashboard in:\n%s", banner)
	}
	for path, token := range map[string]string{"/dashboard/": "", "/api/v1/info": ctl[2], "/api/v1/state": ctl[2]} {
		req, _ := http.NewRequest("GET", ctl[1]+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || path == "/api/v1/state" && !strings.Contains(string(b), `"sim-model"`) {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("up exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("up did not stop on SIGINT")
	}
}

// TestServeDrainsOnSIGTERM: `rolter serve` finishes an in-flight stream after SIGTERM, then exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 10; i++ {
			io.WriteString(w, "data: {\"n\":1}\n\n")
			w.(http.Flusher).Flush()
			time.Sleep(30 * time.Millisecond)
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})}
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	go up.Serve(upLn)
	defer up.Close()
	addr := freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "serve.toml")
	os.WriteFile(cfg, []byte("[server]\nlisten = \""+addr+"\"\ndrain_secs = 5\n[[providers]]\nname = \"a\"\napi_base = \"http://"+upLn.Addr().String()+"\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"), 0o600)
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "-config", cfg, "-log-level", "error"}, io.Discard, io.Discard) }()
	var resp *http.Response
	var err error
	for i := 0; i < 100; i++ {
		resp, err = http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("in-flight stream cut by SIGTERM: %q", b)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
}

// TestServeReloadsOnSIGHUP: SIGHUP re-reads the config file; a broken file is refused and the running
// config keeps serving.
func TestServeReloadsOnSIGHUP(t *testing.T) {
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	go up.Serve(upLn)
	defer up.Close()
	addr := freeAddr(t)
	cfg := filepath.Join(t.TempDir(), "serve.toml")
	text := func(models ...string) string {
		s := "[server]\nlisten = \"" + addr + "\"\ndrain_secs = 2\n[[providers]]\nname = \"a\"\napi_base = \"http://" + upLn.Addr().String() + "\"\n"
		for _, m := range models {
			s += "[[routes]]\nmodel = \"" + m + "\"\n[[routes.targets]]\nprovider = \"a\"\n"
		}
		return s
	}
	os.WriteFile(cfg, []byte(text("m")), 0o600)
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "-config", cfg, "-log-level", "error"}, io.Discard, io.Discard) }()
	models := func() string {
		resp, err := http.Get("http://" + addr + "/v1/models")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		for i := 0; i < 200; i++ {
			if cond() {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("timed out waiting for %s", what)
	}
	waitUntil("the gateway", func() bool { return strings.Contains(models(), `"m"`) })
	os.WriteFile(cfg, []byte(text("m", "m2")), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitUntil("the reloaded route m2", func() bool { return strings.Contains(models(), `"m2"`) })
	os.WriteFile(cfg, []byte(text("m")+"[[routes]]\nmodel = \"bad\"\nstrategy = \"nope\"\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	time.Sleep(200 * time.Millisecond)
	if got := models(); !strings.Contains(got, `"m2"`) || strings.Contains(got, `"bad"`) {
		t.Fatalf("after a broken file, /v1/models = %s; want the previous config", got)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not exit after SIGTERM")
	}
}

// TestCheckPrint: `rolter check -print` prints the effective config, which loads back.
func TestCheckPrint(t *testing.T) {
	var out, errb strings.Builder
	if code := run([]string{"check", "-config", "../../configs/cache-aware.toml", "-print"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"[server]", "max_body_bytes = 16777216", "threshold = 0.5", "[breaker]", "consecutive_5xx = 5"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("check -print lacks %q:\n%s", want, out.String())
		}
	}
	path := filepath.Join(t.TempDir(), "printed.toml")
	os.WriteFile(path, []byte(out.String()), 0o600)
	out.Reset()
	if code := run([]string{"check", "-config", path}, &out, &errb); code != 0 {
		t.Fatalf("the printed config does not load: %s", errb.String())
	}
}

// TestServeWithControlPlane: `rolter serve` with [control] enabled serves /api/v1 on its own listener; a
// route made through it serves at once, and keeps serving across a SIGHUP (the file is composed with the
// store again).
func TestServeWithControlPlane(t *testing.T) {
	s := serveControl(t)
	if c, _ := s.chat(s.key); c != 200 {
		t.Fatalf("chat %d", c)
	}
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	time.Sleep(200 * time.Millisecond)
	if c, _ := s.chat(s.key); c != 200 {
		t.Fatalf("after SIGHUP the org's route answers %d", c)
	}
	s.stop()
}

// servedControl is `rolter serve` in this process with [control] enabled, an upstream that answers every
// chat, and an org ("team") with provider "p", route "m" and a data-plane key made through the API.
type servedControl struct {
	t              *testing.T
	addr, ctl      string // the data plane's and the control plane's addresses
	cfg, head      string // the config file, and its text: [server] and [control]
	upstream       string // the upstream's address
	org, base, key string // the org's id, its API path and its data-plane key
	done           chan int
}

func serveControl(t *testing.T) *servedControl {
	t.Helper()
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(upLn)
	t.Cleanup(func() { up.Close() })
	s := &servedControl{t: t, addr: freeAddr(t), ctl: freeAddr(t), upstream: upLn.Addr().String(), done: make(chan int, 1)}
	dir := t.TempDir()
	s.cfg = filepath.Join(dir, "serve.toml")
	s.head = "[server]\nlisten = \"" + s.addr + "\"\ndrain_secs = 2\n[control]\nenabled = true\nlisten = \"" + s.ctl +
		"\"\nstore = \"" + filepath.Join(dir, "rolter.db") + "\"\nadmin_token_env = \"ROLTER_TEST_ADMIN\"\n"
	os.WriteFile(s.cfg, []byte(s.head), 0o600)
	t.Setenv("ROLTER_TEST_ADMIN", "root-secret")
	go func() {
		s.done <- run([]string{"serve", "-config", s.cfg, "-log-level", "error"}, io.Discard, io.Discard)
	}()
	var code int
	var got string
	for i := 0; i < 200; i++ {
		if code, got = s.api("POST", "/api/v1/orgs", `{"name":"team"}`); code != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != 201 {
		t.Fatalf("create org: %d %s", code, got)
	}
	var org struct{ ID string }
	json.Unmarshal([]byte(got), &org)
	s.org, s.base = org.ID, "/api/v1/orgs/"+org.ID
	if code, got = s.api("POST", s.base+"/providers", `{"name":"p","api_base":"http://`+s.upstream+`"}`); code != 201 {
		t.Fatalf("create provider: %d %s", code, got)
	}
	if code, got = s.api("POST", s.base+"/routes", `{"model":"m","targets":[{"provider":"p"}]}`); code != 201 {
		t.Fatalf("create route: %d %s", code, got)
	}
	if code, got = s.api("POST", s.base+"/keys", `{"name":"k"}`); code != 201 {
		t.Fatalf("create key: %d %s", code, got)
	}
	var key struct{ Secret string }
	json.Unmarshal([]byte(got), &key)
	s.key = key.Secret
	return s
}

// api calls the control plane as the superadmin.
func (s *servedControl) api(method, path, body string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.ctl+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer root-secret")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chat sends a chat request for model m with the data-plane key (none: "") and returns the status and the
// provider that answered.
func (s *servedControl) chat(key string) (int, string) {
	req, _ := http.NewRequest("POST", "http://"+s.addr+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("x-rolter-provider")
}

// stop sends SIGTERM and waits for serve to exit 0.
func (s *servedControl) stop() {
	s.t.Helper()
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-s.done:
		if code != 0 {
			s.t.Fatalf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		s.t.Fatal("serve did not exit after SIGTERM")
	}
}
