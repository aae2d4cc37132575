package webtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/control/webtest/apicheck"
	"github.com/rolter-ai/rolter/engine"
)

// The browser tests run what `rolter serve` runs, through the packages' exported API only: a real store (a
// file in t.TempDir()), a real engine.Gateway on loopback with fake engines, and the control plane over
// HTTP. Every answer the tests receive from the API is validated against openapi.json (apiClient.do), and
// every request answered 2xx must be one openapi.json allows, as in the control package's own tests.

const rootToken = "root-secret-token"

// fileOrg is the id under which the API lists the providers and routes of rolter.toml.
const fileOrg = "file"

var (
	specOnce    sync.Once
	specChecker *apicheck.Checker
	specErr     error
)

// spec returns the checker of openapi.json (the file the control package embeds), loaded once.
func spec(t *testing.T) *apicheck.Checker {
	t.Helper()
	specOnce.Do(func() {
		var data []byte
		if data, specErr = os.ReadFile(filepath.Join("..", "openapi.json")); specErr == nil {
			specChecker, specErr = apicheck.Load(data)
		}
	})
	if specErr != nil {
		t.Fatalf("openapi.json: %s", specErr)
	}
	return specChecker
}

// errorType is the Error's type for each status, written out here as the API's contract: 401, 403, 404,
// and server_error for 5xx; every other error is invalid_request_error.
func errorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	}
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// apiClient calls the control plane and validates every exchange against openapi.json.
type apiClient struct {
	t    *testing.T
	base string
}

type apiResp struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the answer into v.
func (r apiResp) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("cannot decode %s: %s", r.body, err)
	}
}

// apiErrorBody is openapi.json's Error, the fields the tests read.
type apiErrorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// do sends method path (already escaped) with token ("" for none) and body (nil for none). It is safe to
// call from several goroutines: it reports problems with t.Errorf.
func (c *apiClient) do(method, path, token string, body any) apiResp {
	c.t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			c.t.Errorf("cannot encode %v: %s", b, err)
			return apiResp{}
		}
	}
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(raw))
	if err != nil {
		c.t.Errorf("%s %s: %s", method, path, err)
		return apiResp{}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Errorf("%s %s: %s", method, path, err)
		return apiResp{}
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Errorf("%s %s: cannot read the answer: %s", method, path, err)
	}
	r := apiResp{status: resp.StatusCode, header: resp.Header, body: got}
	c.validate(req, raw, r)
	return r
}

// validate checks one exchange against openapi.json: the answer always (status, headers and body), the
// request when it was answered 2xx.
func (c *apiClient) validate(req *http.Request, reqBody []byte, r apiResp) {
	c.t.Helper()
	v := spec(c.t).Exchange(req, reqBody, r.status, r.header, r.body)
	if v.NoRoute != "" {
		c.t.Errorf("%s %s: openapi.json has no such operation: %s", req.Method, req.URL.Path, v.NoRoute)
		return
	}
	if v.Request != "" {
		c.t.Errorf("%s %s was answered %d, but openapi.json does not allow the request: %s\n%s", req.Method, req.URL.Path, r.status, v.Request, reqBody)
	}
	if v.Response != "" {
		c.t.Errorf("%s %s: the answer %d does not fit openapi.json: %s\n%s", req.Method, req.URL.Path, r.status, v.Response, r.body)
	}
	if r.status >= 400 {
		var e apiErrorBody
		if err := json.Unmarshal(r.body, &e); err != nil || e.Error.Type != errorType(r.status) {
			c.t.Errorf("%s %s: error answer %d of type %q, want %q: %s", req.Method, req.URL.Path, r.status, e.Error.Type, errorType(r.status), r.body)
		}
	}
}

// want fails unless the answer has status, and for an error code (if not "").
func want(t *testing.T, r apiResp, status int, code string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	if status >= 400 {
		var e apiErrorBody
		r.json(t, &e)
		if e.Error.Code != code {
			t.Fatalf("code %q, want %q: %s", e.Error.Code, code, r.body)
		}
	}
}

// The API's views, the fields the tests read.
type (
	list[T any] struct {
		Data []T `json:"data"`
	}
	orgView struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	providerView struct {
		config.ProviderConfig
		Version int64 `json:"version"`
	}
	routeView struct {
		config.RouteConfig
		Version int64 `json:"version"`
	}
	credentialView struct {
		Name    string `json:"name"`
		Revoked string `json:"revoked"`
	}
)

// env is one control plane over one gateway and store. File provider "shared" (an engineStub); file route
// "pub" -> shared.
type env struct {
	t        *testing.T
	store    *store.Store
	srv      *control.Server
	api      *apiClient
	gw       *engine.Gateway
	gwURL    string
	file     atomic.Pointer[config.Config]
	logs     *syncbuf.Buffer
	closeAPI func()
}

func fileConfigText(sharedURL string) string {
	return fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[retry]
max_retries = 0
[[providers]]
name = "shared"
api_base = %q
[[routes]]
model = "pub"
[[routes.targets]]
provider = "shared"
`, sharedURL)
}

func parseFile(t *testing.T, text string) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]byte(text), "rolter.toml")
	if err != nil {
		t.Fatalf("bad test config: %s", err)
	}
	return cfg
}

// serveGateway serves gw on a loopback port until the test ends, and returns its URL.
func serveGateway(t *testing.T, gw *engine.Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := gw.Serve(ln); err != nil {
			t.Errorf("serve: %s", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		<-done
	})
	return "http://" + ln.Addr().String()
}

// newEnv starts a gateway on the file config, opens a new store in a temporary folder and serves the
// control plane on it, after a first Reload.
func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{t: t, logs: &syncbuf.Buffer{}}
	e.file.Store(parseFile(t, fileConfigText(newEngineStub(t).URL)))
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw, err := engine.New(e.file.Load(), engine.Options{Logger: log, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	e.gw, e.gwURL = gw, serveGateway(t, gw)

	st, err := store.Open(filepath.Join(t.TempDir(), "rolter.db"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.NewServer(control.Options{
		Store: st, File: e.file.Load, Apply: gw.Reload, State: gw.State, Metrics: gw.WriteMetrics, Usage: gw.DrainUsage,
		AdminToken: rootToken, Listen: "127.0.0.1:0", Logger: log, ReplicaID: "test-gw-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	e.store, e.srv, e.api = st, srv, &apiClient{t: t, base: hs.URL}
	var once sync.Once
	e.closeAPI = func() {
		once.Do(func() {
			hs.Close()
			st.Close()
		})
	}
	t.Cleanup(e.closeAPI)
	return e
}

// su calls the API as the superadmin.
func (e *env) su(method, path string, body any) apiResp {
	e.t.Helper()
	return e.api.do(method, path, rootToken, body)
}

func provider(name, apiBase string) map[string]any {
	return map[string]any{"name": name, "api_base": apiBase}
}

// openControl serves a control plane in open mode (no superadmin token) on a real loopback port, as
// `rolter serve` does with listen = "127.0.0.1:<port>", and counts the requests that reach it.
func openControl(t *testing.T, e *env) (base string, hits *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := control.NewServer(control.Options{Store: e.store, File: e.file.Load, Apply: e.gw.Reload, State: e.gw.State,
		Listen: ln.Addr().String(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hits = &atomic.Int64{}
	h := srv.Handler()
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/orgs" && r.Method == "POST" {
			hits.Add(1)
		}
		h.ServeHTTP(w, r)
	})}}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.URL, hits
}

// orgNames lists the names of the store's orgs, sorted.
func orgNames(t *testing.T, e *env) []string {
	t.Helper()
	var orgs list[orgView]
	e.su("GET", "/api/v1/orgs", nil).json(t, &orgs)
	var names []string
	for _, o := range orgs.Data {
		if o.ID != fileOrg {
			names = append(names, o.Name)
		}
	}
	sort.Strings(names)
	return names
}
