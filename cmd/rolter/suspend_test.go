package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFileRouteWinsOverOrgRoute: an org's route takes model "m"; the operator then routes "m" in the
// file and sends SIGHUP. The reload applies (the file's route serves "m" to anyone), and the org's route
// is set aside and shown as suspended, not the reason the whole reload is refused.
func TestFileRouteWinsOverOrgRoute(t *testing.T) {
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	go up.Serve(upLn)
	defer up.Close()
	addr, ctl := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "serve.toml")
	head := "[server]\nlisten = \"" + addr + "\"\ndrain_secs = 2\n[control]\nenabled = true\nlisten = \"" + ctl + "\"\nstore = \"" +
		filepath.Join(dir, "rolter.db") + "\"\nadmin_token_env = \"ROLTER_TEST_ADMIN\"\n"
	os.WriteFile(cfg, []byte(head), 0o600)
	t.Setenv("ROLTER_TEST_ADMIN", "root-secret")
	done := make(chan int, 1)
	go func() { done <- run([]string{"serve", "-config", cfg, "-log-level", "error"}, io.Discard, io.Discard) }()
	api := func(method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+ctl+path, strings.NewReader(body))
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
	var code int
	var got string
	for i := 0; i < 200; i++ {
		if code, got = api("POST", "/api/v1/orgs", `{"name":"team"}`); code != 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != 201 {
		t.Fatalf("create org: %d %s", code, got)
	}
	var org struct{ ID string }
	json.Unmarshal([]byte(got), &org)
	base := "/api/v1/orgs/" + org.ID
	if code, got = api("POST", base+"/providers", `{"name":"p","api_base":"http://`+upLn.Addr().String()+`"}`); code != 201 {
		t.Fatalf("create provider: %d %s", code, got)
	}
	if code, got = api("POST", base+"/routes", `{"model":"m","targets":[{"provider":"p"}]}`); code != 201 {
		t.Fatalf("create route: %d %s", code, got)
	}
	_, got = api("POST", base+"/keys", `{"name":"k"}`)
	var key struct{ Secret string }
	json.Unmarshal([]byte(got), &key)
	chat := func(key string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[]}`))
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
	if c, p := chat(key.Secret); c != 200 || p != org.ID+"/p" {
		t.Fatalf("the org's route: %d from %q", c, p)
	}

	os.WriteFile(cfg, []byte(head+"[[providers]]\nname = \"filep\"\napi_base = \"http://"+upLn.Addr().String()+
		"\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"filep\"\n"), 0o600)
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	var c int
	var p string
	for i := 0; i < 100; i++ {
		if c, p = chat(""); c == 200 && p == "filep" {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if c != 200 || p != "filep" {
		t.Fatalf("after the operator's reload, model m answers %d from %q: want the file's route", c, p)
	}
	code, got = api("GET", "/api/v1/state", "")
	if code != 200 || !strings.Contains(got, `"suspended_routes":[{"org":"`+org.ID+`","model":"m"`) {
		t.Fatalf("state %d: %s", code, got)
	}
	if code, got = api("GET", base+"/routes/m", ""); code != 200 || !strings.Contains(got, `"suspended":"rolter.toml routes this model`) {
		t.Fatalf("the org's route view %d: %s", code, got)
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("serve exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop")
	}
}
