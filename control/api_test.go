package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/kvindex"
)

// The API tests run a real store (a file in t.TempDir()), a real engine.Gateway on loopback with fake
// upstreams, and the control plane over HTTP. Every answer they receive is validated against openapi.json
// (apiClient.do, by the checker of openapi_test.go), and every request answered 2xx must be one openapi.json
// allows.

const rootToken = "root-secret-token"

var bg = context.Background()

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

// apiErrorBody is openapi.json's Error.
type apiErrorBody struct {
	Error struct {
		Message  string       `json:"message"`
		Type     string       `json:"type"`
		Code     string       `json:"code"`
		Fields   []FieldError `json:"fields"`
		Problems []string     `json:"problems"`
	} `json:"error"`
}

func (r apiResp) apiError(t *testing.T) apiErrorBody {
	t.Helper()
	var e apiErrorBody
	r.json(t, &e)
	return e
}

// do sends method path (already escaped) with token ("" for none) and body (nil for none), and headers as
// name, value pairs. It is safe to call from several goroutines: it reports problems with t.Errorf.
func (c *apiClient) do(method, path, token string, body any, hdr ...string) apiResp {
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
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
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
	v, err := spec(c.t).exchange(req, reqBody, r)
	if err != nil {
		c.t.Errorf("%s %s: cannot check the exchange against openapi.json: %s", req.Method, req.URL.Path, err)
		return
	}
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

// want fails unless the answer has status, and for an error code (if not "") whose message contains each
// of parts.
func want(t *testing.T, r apiResp, status int, code string, parts ...string) apiErrorBody {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	var e apiErrorBody
	if status >= 400 {
		e = r.apiError(t)
		if e.Error.Code != code {
			t.Fatalf("code %q, want %q: %s", e.Error.Code, code, r.body)
		}
		for _, p := range parts {
			if !strings.Contains(e.Error.Message, p) {
				t.Fatalf("message %q lacks %q", e.Error.Message, p)
			}
		}
	}
	return e
}

// upstream is a fake engine: it answers every completion with a small JSON body and counts them.
type upstream struct {
	URL string
	n   atomic.Int64
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"cmpl-1","object":"chat.completion","model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(srv.Close)
	u.URL = srv.URL
	return u
}

// fakeDNS resolves the names of its map; every other name fails.
type fakeDNS map[string]string

func (d fakeDNS) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := d[host]; ok {
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// env is one control plane over one gateway and store. File providers: "shared" (upstream S); file route
// "pub" -> shared. Upstreams A and B are there for orgs' providers.
type env struct {
	t        *testing.T
	dir      string
	path     string // of the store: a file in dir, or a PostgreSQL URL
	store    *store.Store
	srv      *Server
	api      *apiClient
	gw       *engine.Gateway
	gwURL    string
	file     atomic.Pointer[config.Config]
	S, A, B  *upstream
	logs     *syncbuf.Buffer
	closeAPI func()
	keys     map[string]string // org id -> a data-plane key made by orgKey
	replica  string            // the control plane's replica id
	// secretsKey is given to the store at each open (nil: secrets are off).
	secretsKey []byte
	// served is the config the control plane last applied to the gateway.
	served atomic.Pointer[config.Config]
	// refuse, when set, is asked first by apply: an error refuses the config as the gateway would.
	refuse atomic.Pointer[func(*config.Config) error]
}

// apply is the control plane's Apply: it serves cfg on the gateway and keeps it in e.served.
func (e *env) apply(cfg *config.Config) error {
	if f := e.refuse.Load(); f != nil {
		if err := (*f)(cfg); err != nil {
			return err
		}
	}
	if err := e.gw.Reload(cfg); err != nil {
		return err
	}
	e.served.Store(cfg)
	return nil
}

// envs numbers the envs, for their replica ids.
var envs atomic.Int64

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

// newEnv starts a gateway on the file config, opens a store in dir ("" for a new temporary one) and
// serves the control plane on it, after a first Reload.
func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	return newEnvAt(t, filepath.Join(dir, "rolter.db"))
}

// newEnvAt is newEnv with the store at path: a file, or a PostgreSQL URL.
func newEnvAt(t *testing.T, path string) *env {
	t.Helper()
	return newEnvFor(t, path, "127.0.0.1:0", "", nil)
}

// newEnvOn is newEnvAt with the gateway listening on listen, which the file's [server] listen names.
func newEnvOn(t *testing.T, path, listen string) *env {
	t.Helper()
	return newEnvFor(t, path, listen, "", nil)
}

// newEnvWith is newEnvAt with extra appended to the file config, and the store's secrets key (nil: none).
func newEnvWith(t *testing.T, path, extra string, secretsKey []byte) *env {
	t.Helper()
	return newEnvFor(t, path, "127.0.0.1:0", extra, secretsKey)
}

// newEnvFor is newEnvAt with the gateway listening on listen, extra appended to the file config, and the
// store's secrets key (nil: none).
func newEnvFor(t *testing.T, path, listen, extra string, secretsKey []byte) *env {
	t.Helper()
	dir := filepath.Dir(path)
	if strings.Contains(path, "://") { // a PostgreSQL URL, not a file
		dir = t.TempDir()
	}
	e := &env{t: t, dir: dir, path: path, S: newUpstream(t), A: newUpstream(t), B: newUpstream(t), logs: &syncbuf.Buffer{}, secretsKey: secretsKey}
	e.file.Store(parseFile(t, strings.Replace(fileConfigText(e.S.URL), `"127.0.0.1:0"`, strconv.Quote(listen), 1)+extra))
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gw, err := engine.New(e.file.Load(), engine.Options{Logger: log, Version: "test", Resolver: fakeDNS{"kv.test": "169.254.169.254"}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", listen)
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
	e.gw, e.gwURL = gw, "http://"+ln.Addr().String()
	e.open(log)
	return e
}

// open opens the store and serves a new control plane on it.
func (e *env) open(log *slog.Logger) {
	t := e.t
	st, err := store.Open(e.path)
	if err != nil {
		t.Fatal(err)
	}
	if e.secretsKey != nil {
		if err := st.UseSecretsKey(e.secretsKey); err != nil {
			t.Fatal(err)
		}
	}
	if e.replica == "" {
		e.replica = fmt.Sprintf("test-gw-%d", envs.Add(1))
	}
	srv, err := NewServer(Options{
		Store: st, File: e.file.Load, Apply: e.apply, State: e.gw.State, Metrics: e.gw.WriteMetrics, Usage: e.gw.DrainUsage,
		AdminToken: rootToken, Listen: "127.0.0.1:0", Logger: log, ReplicaID: e.replica,
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
}

// chat sends a chat completion for model to the gateway with the data-plane key ("" for none) and returns
// the status and the provider that served it.
func (e *env) chat(model, key string) (int, string) {
	e.t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}]}`, model)
	req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("chat %s: %s", model, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("x-rolter-provider")
}

// orgKey returns a data-plane key of org, made through the API on first use: an org's routes serve only
// requests that carry one of its keys.
func (e *env) orgKey(org string) string {
	e.t.Helper()
	if k, ok := e.keys[org]; ok {
		return k
	}
	r := e.su("POST", "/api/v1/orgs/"+org+"/keys", map[string]any{"name": "test"})
	var k struct {
		Secret string `json:"secret"`
	}
	if r.status != 201 || json.Unmarshal(r.body, &k) != nil || k.Secret == "" {
		e.t.Fatalf("cannot make a key for org %s: %d %s", org, r.status, r.body)
	}
	if e.keys == nil {
		e.keys = map[string]string{}
	}
	e.keys[org] = k.Secret
	return k.Secret
}

func (e *env) wantChat(model, key string, status int, provider string) {
	e.t.Helper()
	got, p := e.chat(model, key)
	if got != status || (provider != "" && p != provider) {
		e.t.Fatalf("chat %s with key %q: status %d from %q, want %d from %q", model, key, got, p, status, provider)
	}
}

// su calls the API as the superadmin.
func (e *env) su(method, path string, body any, hdr ...string) apiResp {
	e.t.Helper()
	return e.api.do(method, path, rootToken, body, hdr...)
}

// mkOrg creates an org and returns its id.
func (e *env) mkOrg(name string) string {
	e.t.Helper()
	r := e.su("POST", "/api/v1/orgs", map[string]string{"name": name})
	want(e.t, r, 201, "")
	var o orgView
	r.json(e.t, &o)
	return o.ID
}

// mkToken creates an org admin token and returns its secret and id.
func (e *env) mkToken(org string) (secret, id string) {
	e.t.Helper()
	r := e.su("POST", "/api/v1/orgs/"+org+"/tokens", map[string]string{"name": "admin"})
	want(e.t, r, 201, "")
	var v struct{ ID, Secret string }
	r.json(e.t, &v)
	return v.Secret, v.ID
}

// mkKey creates a data-plane key with token and returns its secret and id.
func (e *env) mkKey(org, token string) (secret, id string) {
	e.t.Helper()
	r := e.api.do("POST", "/api/v1/orgs/"+org+"/keys", token, map[string]string{"name": "app"})
	want(e.t, r, 201, "")
	var v struct{ ID, Secret string }
	r.json(e.t, &v)
	return v.Secret, v.ID
}

func provider(name, apiBase string) map[string]any {
	return map[string]any{"name": name, "api_base": apiBase}
}

func route(model string, providers ...string) map[string]any {
	var ts []map[string]any
	for _, p := range providers {
		ts = append(ts, map[string]any{"provider": p})
	}
	return map[string]any{"model": model, "targets": ts}
}

// TestAPIDocument: openapi.json is a valid OpenAPI 3 document, it describes exactly the endpoints the
// server has, with the errors each can answer, and it is served as is without a token.
func TestAPIDocument(t *testing.T) {
	ops, err := spec(t).operations()
	if err != nil {
		t.Fatalf("openapi.json: %s", err)
	}
	e := newEnv(t, "")
	documented := map[string]specOperation{}
	for _, op := range ops {
		documented[op.Method+" "+op.Path] = op
		if op.OperationID == "" {
			t.Errorf("%s %s has no operationId", op.Method, op.Path)
		}
	}
	for _, ep := range e.srv.endpoints {
		key := ep.method + " " + ep.path
		op, ok := documented[key]
		if !ok {
			t.Errorf("%s is served but not in openapi.json", key)
			continue
		}
		delete(documented, key)
		wantCodes := map[access][]string{
			anyone:    {"401", "500"},
			orgScoped: {"401", "404", "500"},
			superOnly: {"401", "403", "500"},
		}[ep.access]
		for _, code := range wantCodes {
			if !slices.Contains(op.Responses, code) {
				t.Errorf("%s does not document %s", key, code)
			}
		}
		if isPublic := op.Public; isPublic != (ep.access == public) {
			t.Errorf("%s: security in openapi.json says public %v", key, isPublic)
		}
		if ep.method != "GET" && ep.access != public {
			for _, code := range []string{"400", "409"} {
				if ep.method != "DELETE" && !slices.Contains(op.Responses, code) {
					t.Errorf("%s does not document %s", key, code)
				}
			}
		}
	}
	for key := range documented {
		t.Errorf("%s is in openapi.json but not served", key)
	}
	r := e.api.do("GET", "/api/v1/openapi.json", "", nil)
	want(t, r, 200, "")
	if !bytes.Equal(r.body, openAPI) {
		t.Fatal("GET /api/v1/openapi.json is not the embedded document")
	}
}

// TestAPIOpenMode: without a superadmin token the control plane starts only on loopback, says at Warn that
// it runs open, and then takes callers without a token as the superadmin (org tokens still scope).
func TestAPIOpenMode(t *testing.T) {
	st := openStoreAt(t, filepath.Join(t.TempDir(), "rolter.db"))
	f := func(token, listen string, ok bool) {
		t.Helper()
		var logs syncbuf.Buffer
		_, err := NewServer(Options{
			Store: st, File: func() *config.Config { return config.Default() }, Apply: func(*config.Config) error { return nil },
			State: func() engine.State { return engine.State{} }, AdminToken: token, Listen: listen,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		})
		if (err == nil) != ok {
			t.Fatalf("token %q, listen %q: error %v, want ok %v", token, listen, err, ok)
		}
		if warned := strings.Contains(logs.String(), "level=WARN msg=\"the control plane runs open"); warned != (ok && token == "") {
			t.Fatalf("token %q, listen %q: warned %v: %s", token, listen, warned, logs.String())
		}
	}
	f("", "0.0.0.0:8081", false)
	f("", ":8081", false)
	f("", "10.1.2.3:8081", false)
	f("", "[::]:8081", false)
	f("", "nonsense", false)
	f("", "127.0.0.1:8081", true)
	f("", "127.0.0.2:8081", true)
	f("", "[::1]:8081", true)
	f("", "localhost:8081", true)
	f(rootToken, "0.0.0.0:8081", true)

	e := newEnv(t, "")
	srv, err := NewServer(Options{Store: e.store, File: e.file.Load, Apply: e.gw.Reload, State: e.gw.State, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	open := &apiClient{t: t, base: hs.URL}
	org := e.mkOrg("a")
	token, _ := e.mkToken(org)
	want(t, open.do("POST", "/api/v1/orgs", "", map[string]string{"name": "b"}), 201, "")
	want(t, open.do("GET", "/api/v1/audit", "", nil), 200, "")
	want(t, open.do("GET", "/api/v1/audit", token, nil), 403, "forbidden")
	want(t, open.do("GET", "/api/v1/orgs", "wrong", nil), 401, "unauthorized")
	var orgs list[orgView]
	r := open.do("GET", "/api/v1/orgs", token, nil)
	r.json(t, &orgs)
	if len(orgs.Data) != 1 || orgs.Data[0].ID != org {
		t.Fatalf("an org token in open mode sees %+v", orgs.Data)
	}
}

func openStoreAt(t *testing.T, path string) *store.Store {
	t.Helper()
	s, err := store.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestAPIAuth: 401 without a valid token, 403 for an org token on a superadmin endpoint, 404 for an org
// token naming another org (or "file"), and a revoked token is refused at once.
func TestAPIAuth(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	tokA, tokAID := e.mkToken(a)
	f := func(method, path, auth string, status int, code string) {
		t.Helper()
		var hdr []string
		if auth != "" {
			hdr = []string{"Authorization", auth}
		}
		r := e.api.do(method, path, "", nil, hdr...)
		want(t, r, status, code)
		if status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("401 without WWW-Authenticate: Bearer: %v", r.header)
		}
	}
	f("GET", "/api/v1/orgs", "", 401, "unauthorized")
	f("GET", "/api/v1/orgs", "Bearer", 401, "unauthorized")
	f("GET", "/api/v1/orgs", "Bearer wrong", 401, "unauthorized")
	f("GET", "/api/v1/orgs", "Basic "+rootToken, 401, "unauthorized")
	f("GET", "/api/v1/orgs", "Bearer "+rootToken+"x", 401, "unauthorized")
	f("GET", "/api/v1/orgs", "bearer "+rootToken, 200, "")
	f("GET", "/api/v1/state", "", 401, "unauthorized")
	f("GET", "/api/v1/orgs/"+a+"/providers", "", 401, "unauthorized")
	f("DELETE", "/api/v1/orgs/"+a, "", 401, "unauthorized")

	bearer := "Bearer " + tokA
	f("GET", "/api/v1/orgs/"+a, bearer, 200, "")
	f("GET", "/api/v1/orgs/"+a+"/providers", bearer, 200, "")
	f("POST", "/api/v1/orgs", bearer, 403, "forbidden")
	f("DELETE", "/api/v1/orgs/"+a, bearer, 403, "forbidden")
	f("GET", "/api/v1/audit", bearer, 403, "forbidden")
	f("GET", "/api/v1/orgs/"+a+"/tokens", bearer, 403, "forbidden")
	f("POST", "/api/v1/orgs/"+a+"/tokens", bearer, 403, "forbidden")
	f("DELETE", "/api/v1/orgs/"+a+"/tokens/"+tokAID, bearer, 403, "forbidden")
	// Another org, one that does not exist, and rolter.toml's look the same to an org token.
	for _, other := range []string{b, "org_doesnotexist", fileOrg} {
		f("GET", "/api/v1/orgs/"+other, bearer, 404, "not_found")
		f("GET", "/api/v1/orgs/"+other+"/providers", bearer, 404, "not_found")
		f("GET", "/api/v1/orgs/"+other+"/routes/m", bearer, 404, "not_found")
		f("GET", "/api/v1/orgs/"+other+"/keys", bearer, 404, "not_found")
		f("GET", "/api/v1/orgs/"+other+"/audit", bearer, 404, "not_found")
		f("DELETE", "/api/v1/orgs/"+other+"/providers/p", bearer, 404, "not_found")
	}
	msgOther := e.api.do("GET", "/api/v1/orgs/"+b, tokA, nil).apiError(t).Error.Message
	msgNone := e.api.do("GET", "/api/v1/orgs/org_doesnotexist", tokA, nil).apiError(t).Error.Message
	if strings.ReplaceAll(msgOther, b, "X") != strings.ReplaceAll(msgNone, "org_doesnotexist", "X") {
		t.Fatalf("another org's 404 (%q) differs from a missing org's (%q)", msgOther, msgNone)
	}
	f("GET", "/api/v1/orgs/org_doesnotexist", "Bearer "+rootToken, 404, "not_found")

	want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/tokens/"+tokAID, nil), 204, "")
	f("GET", "/api/v1/orgs/"+a, bearer, 401, "unauthorized")
	want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/tokens/"+tokAID, nil), 409, "conflict", "revoked already")
	var toks list[credentialView]
	e.su("GET", "/api/v1/orgs/"+a+"/tokens", nil).json(t, &toks)
	if len(toks.Data) != 1 || toks.Data[0].Revoked == "" || toks.Data[0].ID != tokAID {
		t.Fatalf("tokens %+v", toks.Data)
	}
	// A data-plane key is not an admin token.
	key, _ := e.mkKey(b, rootToken)
	f("GET", "/api/v1/orgs/"+b, "Bearer "+key, 401, "unauthorized")
}

// TestAPIOrgs: create, list, get and delete orgs; deleting one stops its routes and keys before the
// answer.
func TestAPIOrgs(t *testing.T) {
	e := newEnv(t, "")
	r := e.su("POST", "/api/v1/orgs", map[string]string{"name": "zeta"})
	want(t, r, 201, "")
	var z orgView
	r.json(t, &z)
	if !strings.HasPrefix(z.ID, "org_") || z.Name != "zeta" || z.Created == "" || z.ReadOnly || r.header.Get("Location") != "/api/v1/orgs/"+z.ID {
		t.Fatalf("created %+v, Location %q", z, r.header.Get("Location"))
	}
	a := e.mkOrg("alpha")
	want(t, e.su("POST", "/api/v1/orgs", map[string]string{"name": "zeta"}), 409, "conflict", "taken")
	e1 := want(t, e.su("POST", "/api/v1/orgs", `{}`), 400, "invalid_config")
	e2 := want(t, e.su("POST", "/api/v1/orgs", `{"name":"x","color":"red"}`), 400, "invalid_json")
	e3 := want(t, e.su("POST", "/api/v1/orgs", `{"name":"x","id":"org_mine"}`), 400, "invalid_json", "read-only")
	for _, fe := range [][]FieldError{e1.Error.Fields, e2.Error.Fields, e3.Error.Fields} {
		if len(fe) != 1 {
			t.Fatalf("fields %+v", fe)
		}
	}
	if e1.Error.Fields[0].Field != "name" || e2.Error.Fields[0].Field != "color" || e3.Error.Fields[0].Field != "id" {
		t.Fatalf("fields %+v %+v %+v", e1, e2, e3)
	}

	var orgs list[orgView]
	e.su("GET", "/api/v1/orgs", nil).json(t, &orgs)
	var names []string
	for _, o := range orgs.Data {
		names = append(names, o.ID+"="+o.Name)
	}
	if got, wantNames := strings.Join(names, " "), "file=rolter.toml "+a+"=alpha "+z.ID+"=zeta"; got != wantNames {
		t.Fatalf("orgs %s, want %s", got, wantNames)
	}
	var got orgView
	e.su("GET", "/api/v1/orgs/"+z.ID, nil).json(t, &got)
	if got != z {
		t.Fatalf("get %+v, want %+v", got, z)
	}

	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("m", "p")), 201, "")
	key, _ := e.mkKey(a, rootToken)
	e.wantChat("m", key, 200, a+"/p")
	want(t, e.su("DELETE", "/api/v1/orgs/"+a, nil), 204, "")
	e.wantChat("m", key, 404, "") // the route went with the org, before the answer
	want(t, e.su("GET", "/api/v1/orgs/"+a, nil), 404, "not_found")
	want(t, e.su("GET", "/api/v1/orgs/"+a+"/routes", nil), 404, "not_found")
	want(t, e.su("DELETE", "/api/v1/orgs/"+a, nil), 404, "not_found")
	if st, _ := e.store.Load(bg); len(st.Providers)+len(st.Routes)+len(st.Keys) != 0 {
		t.Fatalf("the deleted org left %+v", st)
	}
}

// TestAPIProviders: every verb on providers, versions and If-Match, and the config as the gateway runs it
// (defaults filled in, kv_events absent means no source).
func TestAPIProviders(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	base := "/api/v1/orgs/" + a + "/providers"
	var list0 list[providerView]
	e.su("GET", base, nil).json(t, &list0)
	if len(list0.Data) != 0 {
		t.Fatalf("a new org has providers %+v", list0.Data)
	}

	r := e.su("POST", base, map[string]any{"name": "p", "api_base": e.A.URL, "headers": map[string]string{"X-Team": "ml"}})
	want(t, r, 201, "")
	var p providerView
	r.json(t, &p)
	if p.Name != "p" || p.meta.Org != a || p.Version != 1 || p.Kind != "openai_compatible" || p.MaxConns != 1024 || p.KVEvents != nil || p.LMCache != nil ||
		p.Headers["X-Team"] != "ml" || p.Created == "" || p.Created != p.Updated {
		t.Fatalf("created %+v", p)
	}
	if r.header.Get("ETag") != `"1"` || r.header.Get("Location") != base+"/p" {
		t.Fatalf("headers %v", r.header)
	}
	want(t, e.su("POST", base, provider("p", e.A.URL)), 409, "conflict", "exists (version 1)")
	want(t, e.su("POST", base, map[string]any{"api_base": e.A.URL}), 400, "invalid_config", "missing provider name")

	// Omitted numbers of kv_events and lmcache are their defaults; set ones are kept.
	r = e.su("PUT", base+"/p", map[string]any{"api_base": e.A.URL, "max_conns": 8,
		"lmcache": map[string]any{"endpoint": e.A.URL + "/lmcache", "stale_secs": 30}}, "If-Match", `"1"`)
	want(t, r, 200, "")
	p = providerView{}
	r.json(t, &p)
	if p.Version != 2 || p.MaxConns != 8 || p.Headers != nil || p.LMCache == nil || p.LMCache.RefreshSecs != 2 || p.LMCache.StaleSecs != 30 || r.header.Get("ETag") != `"2"` {
		t.Fatalf("replaced %+v %+v", p, p.LMCache)
	}
	if kvindex.Supported {
		r = e.su("PUT", base+"/p", map[string]any{"api_base": e.A.URL, "kv_events": map[string]any{"endpoint": "tcp://127.0.0.1:5557"}})
		want(t, r, 200, "")
		p = providerView{}
		r.json(t, &p)
		if p.Version != 3 || p.KVEvents == nil || p.KVEvents.Mode != "connect" || p.KVEvents.MaxBlocks != 1_000_000 || p.KVEvents.StaleSecs != 30 || p.LMCache != nil {
			t.Fatalf("replaced %+v %+v", p, p.KVEvents)
		}
	}
	version := p.Version
	ifMatch := fmt.Sprintf(`"%d"`, version)

	want(t, e.su("PUT", base+"/p", provider("p", e.A.URL), "If-Match", `"1"`), 409, "conflict", fmt.Sprintf("expected version 1, the stored version is %d", version))
	want(t, e.su("PUT", base+"/q", provider("q", e.A.URL), "If-Match", `"1"`), 409, "conflict", "does not exist")
	want(t, e.su("PUT", base+"/q", provider("q", e.A.URL), "If-Match", `*`), 409, "conflict", "does not exist")
	want(t, e.su("PUT", base+"/p", provider("p", e.A.URL), "If-Match", `W/"1"`), 400, "invalid_request", "If-Match")
	want(t, e.su("PUT", base+"/p", provider("other", e.A.URL)), 400, "invalid_config", "differs from the name in the path")

	r = e.su("GET", base+"/p", nil)
	want(t, r, 200, "")
	var got providerView
	r.json(t, &got)
	if got.Version != version || r.header.Get("ETag") != ifMatch || got.Created == got.Updated {
		t.Fatalf("get %+v, ETag %q", got, r.header.Get("ETag"))
	}
	want(t, e.su("GET", base+"/nope", nil), 404, "not_found", `has no provider "nope"`)

	// PUT creates too (201); a name with a slash is one path segment, percent-encoded.
	slashed := base + "/" + url.PathEscape("gpu/a100")
	r = e.su("PUT", slashed, map[string]any{"api_base": e.B.URL})
	want(t, r, 201, "")
	if r.header.Get("Location") != slashed {
		t.Fatalf("Location %q, want %q", r.header.Get("Location"), slashed)
	}
	var ps list[providerView]
	e.su("GET", base, nil).json(t, &ps)
	if len(ps.Data) != 2 || ps.Data[0].Name != "gpu/a100" || ps.Data[1].Name != "p" {
		t.Fatalf("list %+v", ps.Data)
	}
	want(t, e.su("DELETE", slashed, nil), 204, "")

	want(t, e.su("DELETE", base+"/p", nil, "If-Match", `"1"`), 409, "conflict", "expected version 1")
	want(t, e.su("DELETE", base+"/p", nil, "If-Match", ifMatch), 204, "")
	want(t, e.su("DELETE", base+"/p", nil), 404, "not_found")
	want(t, e.su("DELETE", base+"/p", nil, "If-Match", ifMatch), 409, "conflict", "does not exist")
	want(t, e.su("GET", "/api/v1/orgs/org_nope/providers/p", nil), 404, "not_found")
	want(t, e.su("PUT", "/api/v1/orgs/org_nope/providers/p", provider("p", e.A.URL)), 404, "not_found")
}

// TestAPIValidation: an object is checked by the engine's validation (the same messages as rolter.toml's,
// at JSON field paths instead of file:line) and decoded strictly, every problem at once.
func TestAPIValidation(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/providers", provider("bp", e.B.URL)), 201, "")

	type fe = FieldError
	f := func(kind, body string, status int, code string, wantFields ...fe) {
		t.Helper()
		r := e.su("POST", "/api/v1/orgs/"+a+"/"+kind, body)
		got := want(t, r, status, code).Error.Fields
		if len(got) != len(wantFields) {
			t.Fatalf("%s: fields %+v, want %+v", body, got, wantFields)
		}
		for i := range got {
			if got[i].Field != wantFields[i].Field || !strings.Contains(got[i].Message, wantFields[i].Message) {
				t.Fatalf("%s: field %+v, want %+v", body, got[i], wantFields[i])
			}
		}
	}
	api := func(s string) string { return fmt.Sprintf(`"api_base":%q`, s) }
	okBase := api(e.A.URL)
	// Config problems, as the engine names them.
	f("providers", `{"name":"x",`+api("ftp://h")+`}`, 400, "invalid_config", fe{"api_base", `URL "ftp://h" must start with http:// or https://`})
	f("providers", `{"name":"x",`+api("http://169.254.169.254")+`}`, 400, "invalid_config", fe{"api_base", "block_link_local"})
	f("providers", `{"name":"x",`+api("")+`,"max_conns":-1,"headers":{"bad header":"v"}}`, 400, "invalid_config",
		fe{"api_base", "missing URL"}, fe{"headers", `invalid header name "bad header"`}, fe{"max_conns", "must be > 0, got -1"})
	f("providers", `{"name":"x",`+okBase+`,"lmcache":{"stale_secs":-1}}`, 400, "invalid_config",
		fe{"lmcache.endpoint", "missing URL"}, fe{"lmcache.stale_secs", "must be > 0"})
	if kvindex.Supported {
		f("providers", `{"name":"x",`+okBase+`,"kv_events":{"endpoint":"tcp://169.254.169.254:5557"}}`, 400, "invalid_config",
			fe{"kv_events.endpoint", "block_link_local"})
		f("providers", `{"name":"x",`+okBase+`,"kv_events":{"endpoint":"tcp://127.0.0.1:5557","mode":"sideways"}}`, 400, "invalid_config",
			fe{"kv_events.mode", "sideways"})
	}
	// Shape problems, found before any config check, with their paths.
	f("providers", `{"name":"x",`+okBase+`,"kv_events":{"endpoint":"tcp://127.0.0.1:5557","bogus":1},"api_bse":"x"}`, 400, "invalid_json",
		fe{"kv_events.bogus", "unknown field"}, fe{"api_bse", "unknown field"})
	f("providers", `{"name":"x",`+okBase+`,"max_conns":"many","headers":{"a":1},"kv_events":[]}`, 400, "invalid_json",
		fe{"max_conns", "must be an integer, got a string"}, fe{"headers.a", "must be a string, got a number"}, fe{"kv_events", "must be an object, got an array"})
	f("providers", `{"name":"x",`+okBase+`,"max_conns":1.5,"kind":null}`, 400, "invalid_json",
		fe{"max_conns", "must be an integer, got 1.5"}, fe{"kind", "must be a string, got null"})
	f("providers", `{"name":"x","name":"y",`+okBase+`}`, 400, "invalid_json", fe{"name", "given twice"})
	f("providers", `{"name":"x",`+okBase+`,"version":3,"org":"other"}`, 400, "invalid_json", fe{"version", "read-only"}, fe{"org", "read-only"})
	f("providers", `{"name":"x",`+okBase, 400, "invalid_json")
	f("providers", `{"name":"x",`+okBase+`} {}`, 400, "invalid_json")
	f("providers", `["name"]`, 400, "invalid_json")
	f("providers", ``, 400, "invalid_json")
	f("providers", `{"name":"x",`+okBase+`,"max_conns":1e999}`, 400, "invalid_json", fe{"max_conns", "must be an integer"})
	f("providers", `{"name":"a\u0001b",`+okBase+`}`, 400, "invalid_config", fe{"name", "control characters"})
	f("providers", `{"name":"`+strings.Repeat("n", store.MaxNameLen+1)+`",`+okBase+`}`, 400, "invalid_config", fe{"name", "more than 256"})
	// Routes.
	f("routes", `{"model":"m","targets":[{"provider":"nope"}]}`, 400, "invalid_config", fe{"targets[0].provider", `unknown provider "nope"`})
	f("routes", `{"model":"m","targets":[{"provider":"p"},{"provider":"bp"}]}`, 400, "invalid_config", fe{"targets[1].provider", `unknown provider "bp"`})
	f("routes", `{"model":"m","targets":[{"provider":"p"},{"provider":"`+b+`/bp"}]}`, 400, "invalid_config", fe{"targets[1].provider", "unknown provider"})
	f("routes", `{"model":"m","targets":[]}`, 400, "invalid_config", fe{"targets", `route "m" has no targets`})
	f("routes", `{"model":"m","strategy":"fastest","targets":[{"provider":"p"}]}`, 400, "invalid_config", fe{"strategy", `unknown strategy "fastest"`})
	f("routes", `{"model":"m","targets":[{"provider":"p","weight":0}],"params":{"threshold":0.5}}`, 400, "invalid_config",
		fe{"targets[0].weight", "weight must be > 0, got 0"}, fe{"params.threshold", `strategy "round_robin" takes no parameters`})
	f("routes", `{"model":"m","targets":[{"provider":"p","wieght":2}],"params":{"treshold":1}}`, 400, "invalid_json",
		fe{"targets[0].wieght", "unknown field"}, fe{"params.treshold", "unknown field"})
	f("routes", `{"targets":[{"provider":"p"}]}`, 400, "invalid_config", fe{"model", "missing public model name"})
	if kvindex.Supported {
		f("routes", `{"model":"m","strategy":"precise_cache_aware","targets":[{"provider":"p"}]}`, 400, "invalid_config",
			fe{"targets[0].provider", "needs [providers.kv_events]"})
	}

	// One validation path: the API's message for a key is the TOML loader's for the same key.
	toml := fileConfigText(e.S.URL) + "[[providers]]\nname = \"x\"\napi_base = \"http://169.254.169.254\"\nmax_conns = -1\n"
	_, err := config.Parse([]byte(toml), "rolter.toml")
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("the TOML was accepted: %v", err)
	}
	r := e.su("POST", "/api/v1/orgs/"+a+"/providers", `{"name":"x","api_base":"http://169.254.169.254","max_conns":-1}`)
	fields := want(t, r, 400, "invalid_config").Error.Fields
	for _, fe := range fields {
		i := slices.IndexFunc(errs, func(ce *config.Error) bool { return ce.Key == "providers[1]."+fe.Field })
		if i < 0 || errs[i].Msg != fe.Message || errs[i].Line == 0 {
			t.Fatalf("API %+v; TOML %v", fe, errs)
		}
	}
	if st, _ := e.store.Load(bg); len(st.Providers) != 2 || len(st.Routes) != 0 {
		t.Fatalf("refused writes reached the store: %+v", st)
	}
}

// TestAPIRoutes: routes on an org's providers and the file's shared ones, models as one namespace, and a
// change that would break another object refused with what it breaks.
func TestAPIRoutes(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	base := "/api/v1/orgs/" + a + "/routes"
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")

	r := e.su("POST", base, map[string]any{"model": "m", "strategy": "least_load", "targets": []map[string]any{{"provider": "p", "weight": 2}, {"provider": "shared", "model": "up"}}})
	want(t, r, 201, "")
	var rv routeView
	r.json(t, &rv)
	if rv.Model != "m" || rv.meta.Org != a || rv.Strategy != "least_load" || len(rv.Targets) != 2 || rv.Targets[0].Model != "m" || *rv.Targets[0].Weight != 2 ||
		rv.Targets[1].Provider != "shared" || rv.Targets[1].Model != "up" || *rv.Targets[1].Weight != 1 || r.header.Get("Location") != base+"/m" {
		t.Fatalf("created %+v", rv)
	}
	e.wantChat("m", e.orgKey(a), 200, "")
	want(t, e.su("POST", base, route("m", "p")), 409, "conflict", "exists")
	// The public model names are one namespace: rolter.toml's and every org's.
	want(t, e.su("POST", base, route("pub", "p")), 409, "conflict", `model "pub" is routed by rolter.toml`)
	want(t, e.su("PUT", base+"/pub", route("pub", "p")), 409, "conflict", "rolter.toml")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/providers", provider("p", e.B.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/routes", route("m", "p")), 409, "conflict", `model "m" is used by another org`)
	want(t, e.su("PUT", "/api/v1/orgs/"+b+"/routes/m", route("m", "p")), 409, "conflict", "another org")
	want(t, e.su("GET", "/api/v1/orgs/"+b+"/routes/m", nil), 404, "not_found")
	want(t, e.su("DELETE", "/api/v1/orgs/"+b+"/routes/m", nil), 409, "conflict", "another org")

	// Deleting (or breaking) a provider a route uses is refused with the route's problem.
	er := want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/providers/p", nil), 409, "conflict", "would break")
	if len(er.Error.Problems) != 1 || !strings.Contains(er.Error.Problems[0], `route "m".targets[0].provider: unknown provider "p"`) {
		t.Fatalf("problems %q", er.Error.Problems)
	}
	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/providers/p", provider("p", e.A.URL)), 200, "")

	// A model with a slash is one percent-encoded path segment.
	slashed := base + "/" + url.PathEscape("team/llama-3")
	want(t, e.su("PUT", slashed, map[string]any{"targets": []map[string]any{{"provider": "p"}}}), 201, "")
	e.wantChat("team/llama-3", e.orgKey(a), 200, a+"/p")
	r = e.su("GET", slashed, nil)
	want(t, r, 200, "")
	r.json(t, &rv)
	if rv.Model != "team/llama-3" || rv.Version != 1 {
		t.Fatalf("get %+v", rv)
	}
	want(t, e.su("PUT", slashed, route("team/llama-4", "p")), 400, "invalid_config", "differs from the model in the path")
	var rs list[routeView]
	e.su("GET", base, nil).json(t, &rs)
	if len(rs.Data) != 2 || rs.Data[0].Model != "m" || rs.Data[1].Model != "team/llama-3" {
		t.Fatalf("list %+v", rs.Data)
	}
	want(t, e.su("DELETE", slashed, nil, "If-Match", `"1"`), 204, "")
	e.wantChat("team/llama-3", "", 404, "")
	want(t, e.su("GET", slashed, nil), 404, "not_found")
	// Now the provider's route is gone, another org's route may take the model.
	want(t, e.su("DELETE", base+"/m", nil), 204, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/routes", route("m", "p")), 201, "")
	e.wantChat("m", e.orgKey(b), 200, b+"/p")
}

// TestAPIServesChangeAtOnce: the answer to a write comes after the gateway serves it, so the first request
// after it sees the change: a route switched between targets, a key created and revoked, a route deleted.
func TestAPIServesChangeAtOnce(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	base := "/api/v1/orgs/" + a
	want(t, e.su("POST", base+"/providers", provider("pa", e.A.URL)), 201, "")
	want(t, e.su("POST", base+"/providers", provider("pb", e.B.URL)), 201, "")
	want(t, e.su("POST", base+"/routes", route("m", "pa")), 201, "")
	e.wantChat("m", e.orgKey(a), 200, a+"/pa")
	for i := 2; i < 22; i++ {
		p, up := "pb", e.B
		if i%2 == 1 {
			p, up = "pa", e.A
		}
		before := up.n.Load()
		want(t, e.su("PUT", base+"/routes/m", route("m", p), "If-Match", fmt.Sprintf(`"%d"`, i-1)), 200, "")
		e.wantChat("m", e.orgKey(a), 200, a+"/"+p)
		if up.n.Load() != before+1 {
			t.Fatalf("round %d: upstream %s served %d requests, want 1", i, p, up.n.Load()-before)
		}
	}
	key, id := e.mkKey(a, rootToken)
	e.wantChat("m", "", 401, "") // an org with keys needs one
	e.wantChat("m", key, 200, "")
	// The org keeps a key: revoking an org's last key makes its routes public again (engine, "Once the org
	// has data-plane keys"), which is not what this checks.
	key2, _ := e.mkKey(a, rootToken)
	e.wantChat("m", key2, 200, "")
	want(t, e.su("DELETE", base+"/keys/"+id, nil), 204, "")
	e.wantChat("m", key, 401, "")
	e.wantChat("m", key2, 200, "")
	want(t, e.su("DELETE", base+"/routes/m", nil), 204, "")
	e.wantChat("m", "", 404, "")
}

// TestAPIKeys: a key's secret is answered once, only its keyed hash and prefix are stored, it works on its
// org's models only, and a revoked key stops working.
func TestAPIKeys(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	for _, org := range []string{a, b} {
		want(t, e.su("POST", "/api/v1/orgs/"+org+"/providers", provider("p", e.A.URL)), 201, "")
	}
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("ma", "p")), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/routes", route("mb", "p")), 201, "")

	r := e.su("POST", "/api/v1/orgs/"+a+"/keys", map[string]string{"name": "app"})
	want(t, r, 201, "")
	var k struct {
		credentialView
		Secret string `json:"secret"`
	}
	r.json(t, &k)
	if !regexp.MustCompile(`^rk-[A-Za-z0-9_-]{43}$`).MatchString(k.Secret) || k.Prefix != k.Secret[:8] || !strings.HasPrefix(k.ID, "key_") || k.Org != a || k.Name != "app" {
		t.Fatalf("key %+v", k)
	}
	pepper := e.store.Pepper()
	st, _ := e.store.Load(bg)
	if len(st.Keys) != 1 || st.Keys[0].Hash != sha256.Sum256(append(pepper[:], k.Secret...)) {
		t.Fatalf("stored keys %+v", st.Keys)
	}
	keyB, _ := e.mkKey(b, rootToken)

	r = e.su("GET", "/api/v1/orgs/"+a+"/keys", nil)
	want(t, r, 200, "")
	if bytes.Contains(r.body, []byte(k.Secret)) || bytes.Contains(r.body, []byte(k.Secret[8:])) {
		t.Fatal("the key list shows the secret")
	}
	var ks list[credentialView]
	r.json(t, &ks)
	if len(ks.Data) != 1 || ks.Data[0] != k.credentialView {
		t.Fatalf("keys %+v, want %+v", ks.Data, k.credentialView)
	}

	e.wantChat("ma", "", 401, "")
	e.wantChat("ma", "wrong", 401, "")
	e.wantChat("ma", k.Secret, 200, "")
	e.wantChat("mb", k.Secret, 404, "") // org A's key does not see org B's model
	e.wantChat("ma", keyB, 404, "")
	e.wantChat("mb", keyB, 200, "")
	e.wantChat("pub", "", 200, "") // rolter.toml's routes are public

	want(t, e.su("DELETE", "/api/v1/orgs/"+b+"/keys/"+k.ID, nil), 404, "not_found") // another org's key id
	want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/keys/key_nope", nil), 404, "not_found")
	// A second key keeps the org keyed (see TestAPIServesChangeAtOnce).
	spare, _ := e.mkKey(a, rootToken)
	want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/keys/"+k.ID, nil), 204, "")
	e.wantChat("ma", k.Secret, 401, "")
	e.wantChat("ma", spare, 200, "")
	want(t, e.su("DELETE", "/api/v1/orgs/"+a+"/keys/"+k.ID, nil), 409, "conflict", "revoked already")
	e.su("GET", "/api/v1/orgs/"+a+"/keys", nil).json(t, &ks)
	if len(ks.Data) != 2 || ks.Data[0].Revoked == "" || ks.Data[1].Revoked != "" {
		t.Fatalf("keys after revoking %+v", ks.Data)
	}
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/keys", `{"name":""}`), 400, "invalid_config", "empty")
	want(t, e.su("POST", "/api/v1/orgs/org_nope/keys", map[string]string{"name": "x"}), 404, "not_found")
}

// TestAPICrossOrg: an org admin token sees and changes its org only, and is the actor of its changes.
func TestAPICrossOrg(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	tokA, tokAID := e.mkToken(a)
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/providers", provider("bp", e.B.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+b+"/routes", route("mb", "bp")), 201, "")

	as := func(method, path string, body any, hdr ...string) apiResp {
		t.Helper()
		return e.api.do(method, path, tokA, body, hdr...)
	}
	var orgs list[orgView]
	as("GET", "/api/v1/orgs", nil).json(t, &orgs)
	if len(orgs.Data) != 1 || orgs.Data[0].ID != a {
		t.Fatalf("an org token lists %+v", orgs.Data)
	}
	want(t, as("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, as("POST", "/api/v1/orgs/"+a+"/routes", route("ma", "p")), 201, "")
	want(t, as("POST", "/api/v1/orgs/"+a+"/routes", route("ma2", "bp")), 400, "invalid_config", `unknown provider "bp"`)
	want(t, as("POST", "/api/v1/orgs/"+a+"/routes", route("mb", "p")), 409, "conflict", "another org")
	key, _ := e.mkKey(a, tokA)
	e.wantChat("ma", key, 200, a+"/p")

	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/v1/orgs/" + b + "/providers/bp", nil},
		{"PUT", "/api/v1/orgs/" + b + "/providers/bp", provider("bp", e.A.URL)},
		{"DELETE", "/api/v1/orgs/" + b + "/providers/bp", nil},
		{"POST", "/api/v1/orgs/" + b + "/providers", provider("x", e.A.URL)},
		{"GET", "/api/v1/orgs/" + b + "/routes", nil},
		{"PUT", "/api/v1/orgs/" + b + "/routes/mb", route("mb", "p")},
		{"DELETE", "/api/v1/orgs/" + b + "/routes/mb", nil},
		{"POST", "/api/v1/orgs/" + b + "/keys", map[string]string{"name": "x"}},
		{"GET", "/api/v1/orgs/" + fileOrg + "/routes/pub", nil},
	} {
		want(t, as(c.method, c.path, c.body), 404, "not_found")
	}
	e.wantChat("mb", e.orgKey(b), 200, b+"/bp") // untouched

	var st engine.State
	r := as("GET", "/api/v1/state", nil)
	want(t, r, 200, "")
	r.json(t, &st)
	if len(st.Routes) != 1 || st.Routes[0].Model != "ma" || st.Routes[0].Org != a || st.Routes[0].Targets[0].Provider != "p" {
		t.Fatalf("an org token's state %+v", st.Routes)
	}
	var audit list[auditView]
	as("GET", "/api/v1/orgs/"+a+"/audit", nil).json(t, &audit)
	if len(audit.Data) != 5 {
		t.Fatalf("audit %+v", audit.Data)
	}
	for _, en := range audit.Data[:3] { // key, route, provider: the token's
		if en.Actor != tokAID || en.Org != a {
			t.Fatalf("entry %+v, want actor %s", en, tokAID)
		}
	}
}

// TestAPIFileReadOnly: rolter.toml's providers and routes are shown under org "file" to the superadmin, and
// every write there is 409.
func TestAPIFileReadOnly(t *testing.T) {
	e := newEnv(t, "")
	var o orgView
	e.su("GET", "/api/v1/orgs/file", nil).json(t, &o)
	if o != fileOrgView {
		t.Fatalf("org file %+v", o)
	}
	var ps list[providerView]
	e.su("GET", "/api/v1/orgs/file/providers", nil).json(t, &ps)
	if len(ps.Data) != 1 || ps.Data[0].Name != "shared" || ps.Data[0].APIBase != e.S.URL || ps.Data[0].meta.Org != fileOrg || ps.Data[0].Version != 0 {
		t.Fatalf("file providers %+v", ps.Data)
	}
	r := e.su("GET", "/api/v1/orgs/file/routes/pub", nil)
	want(t, r, 200, "")
	var rv routeView
	r.json(t, &rv)
	if rv.Model != "pub" || rv.Targets[0].Provider != "shared" || rv.meta.Org != fileOrg || r.header.Get("ETag") != "" {
		t.Fatalf("file route %+v", rv)
	}
	want(t, e.su("GET", "/api/v1/orgs/file/routes/nope", nil), 404, "not_found", "rolter.toml has no route")
	for _, path := range []string{"keys", "audit"} {
		var l list[json.RawMessage]
		e.su("GET", "/api/v1/orgs/file/"+path, nil).json(t, &l)
		if len(l.Data) != 0 {
			t.Fatalf("file %s %s", path, l.Data)
		}
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/v1/orgs/file/providers", provider("x", e.A.URL)},
		{"PUT", "/api/v1/orgs/file/providers/shared", provider("shared", e.A.URL)},
		{"DELETE", "/api/v1/orgs/file/providers/shared", nil},
		{"POST", "/api/v1/orgs/file/routes", route("x", "shared")},
		{"PUT", "/api/v1/orgs/file/routes/pub", route("pub", "shared")},
		{"DELETE", "/api/v1/orgs/file/routes/pub", nil},
		{"POST", "/api/v1/orgs/file/keys", map[string]string{"name": "x"}},
		{"DELETE", "/api/v1/orgs/file/keys/key_x", nil},
		{"POST", "/api/v1/orgs/file/tokens", map[string]string{"name": "x"}},
		{"DELETE", "/api/v1/orgs/file", nil},
	} {
		want(t, e.su(c.method, c.path, c.body), 409, "conflict", readOnlyFile)
	}
	e.wantChat("pub", "", 200, "shared")
}

// TestAPIAudit: every change is in the audit log with its actor, action, object and when; the superadmin
// reads all of it, deleted orgs' included.
func TestAPIAudit(t *testing.T) {
	e := newEnv(t, "")
	start := time.Now().Add(-time.Second)
	a := e.mkOrg("a")
	tok, tokID := e.mkToken(a)
	want(t, e.api.do("POST", "/api/v1/orgs/"+a+"/providers", tok, provider("p", e.A.URL)), 201, "")
	want(t, e.api.do("PUT", "/api/v1/orgs/"+a+"/providers/p", tok, provider("p", e.B.URL)), 200, "")
	want(t, e.api.do("POST", "/api/v1/orgs/"+a+"/routes", tok, route("m", "p")), 201, "")
	want(t, e.api.do("DELETE", "/api/v1/orgs/"+a+"/routes/m", tok, nil), 204, "")
	_, keyID := e.mkKey(a, tok)
	want(t, e.api.do("DELETE", "/api/v1/orgs/"+a+"/keys/"+keyID, tok, nil), 204, "")
	// Refused writes leave no entry.
	want(t, e.api.do("POST", "/api/v1/orgs/"+a+"/routes", tok, route("m", "nope")), 400, "invalid_config")

	wantLog := []string{
		"superadmin create org a",
		"superadmin create token " + tokID,
		tokID + " create provider p",
		tokID + " replace provider p",
		tokID + " create route m",
		tokID + " delete route m",
		tokID + " create key " + keyID,
		tokID + " revoke key " + keyID,
	}
	slices.Reverse(wantLog) // newest first
	var l list[auditView]
	e.api.do("GET", "/api/v1/orgs/"+a+"/audit", tok, nil).json(t, &l)
	var got []string
	for _, en := range l.Data {
		got = append(got, en.Actor+" "+en.Action+" "+en.Object+" "+en.Name)
		at, err := time.Parse(time.RFC3339, en.At)
		if err != nil || at.Before(start) || at.After(time.Now()) || en.Org != a {
			t.Fatalf("entry %+v", en)
		}
	}
	if !slices.Equal(got, wantLog) {
		t.Fatalf("audit\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(wantLog, "\n"))
	}
	e.api.do("GET", "/api/v1/orgs/"+a+"/audit?limit=2", tok, nil).json(t, &l)
	if len(l.Data) != 2 || l.Data[0].Actor+" "+l.Data[0].Action != tokID+" revoke" {
		t.Fatalf("limit 2: %+v", l.Data)
	}
	want(t, e.su("GET", "/api/v1/orgs/"+a+"/audit?limit=0", nil), 400, "invalid_request", "limit")
	want(t, e.su("GET", "/api/v1/audit?limit=x", nil), 400, "invalid_request", "limit")

	want(t, e.su("DELETE", "/api/v1/orgs/"+a, nil), 204, "")
	want(t, e.su("GET", "/api/v1/orgs/"+a+"/audit", nil), 404, "not_found")
	e.su("GET", "/api/v1/audit?org="+a, nil).json(t, &l)
	if len(l.Data) != len(wantLog)+1 || l.Data[0].Action+" "+l.Data[0].Object != "delete org" || l.Data[0].Actor != "superadmin" {
		t.Fatalf("audit of the deleted org %+v", l.Data)
	}
	e.su("GET", "/api/v1/audit?limit=1000", nil).json(t, &l)
	if len(l.Data) != len(wantLog)+1 {
		t.Fatalf("whole audit %+v", l.Data)
	}
}

// TestAPIApplyFailed: a change the gateway refuses when applying it (a KV endpoint whose name resolves to
// a refused address, found only when subscribing) is answered 422 and taken back out of the store, and the
// running config keeps serving.
func TestAPIApplyFailed(t *testing.T) {
	if !kvindex.Supported {
		t.Skip("kv_events needs cgo")
	}
	e := newEnv(t, "")
	a := e.mkOrg("a")
	base := "/api/v1/orgs/" + a
	want(t, e.su("POST", base+"/providers", provider("p", e.A.URL)), 201, "")
	// kv.test passes the config check (a name, checked by its name rules) and is not subscribed to until a
	// precise_cache_aware route uses the provider.
	want(t, e.su("POST", base+"/providers", map[string]any{"name": "kv", "api_base": e.B.URL, "kv_events": map[string]any{"endpoint": "tcp://kv.test:5557"}}), 201, "")
	want(t, e.su("POST", base+"/routes", route("m", "p")), 201, "")
	key := e.orgKey(a)
	gen := e.gw.State().Generation

	precise := map[string]any{"model": "mk", "strategy": "precise_cache_aware", "targets": []map[string]any{{"provider": "kv"}}}
	er := want(t, e.su("POST", base+"/routes", precise), 422, "apply_failed", `provider "kv"`, "169.254.169.254", "the store was put back")
	if strings.Contains(er.Error.Message, a+"/") {
		t.Fatalf("the message names the engine's provider: %s", er.Error.Message)
	}
	want(t, e.su("GET", base+"/routes/mk", nil), 404, "not_found")
	e.wantChat("mk", "", 404, "")

	precise["model"] = "m"
	want(t, e.su("PUT", base+"/routes/m", precise, "If-Match", `"1"`), 422, "apply_failed")
	r := e.su("GET", base+"/routes/m", nil)
	var rv routeView
	r.json(t, &rv)
	if rv.Strategy != "round_robin" || rv.Targets[0].Provider != "p" || rv.Version != 3 { // replaced, then put back
		t.Fatalf("route after a refused change %+v", rv)
	}
	e.wantChat("m", key, 200, a+"/p")
	if g := e.gw.State().Generation; g != gen {
		t.Fatalf("refused changes moved the generation from %d to %d", gen, g)
	}
	var l list[auditView]
	e.su("GET", base+"/audit?limit=4", nil).json(t, &l)
	var got []string
	for _, en := range l.Data {
		got = append(got, en.Action+" "+en.Object+" "+en.Name)
	}
	if wantLog := []string{"replace route m", "replace route m", "delete route mk", "create route mk"}; !slices.Equal(got, wantLog) {
		t.Fatalf("audit %q, want %q", got, wantLog)
	}
}

// TestAPIRestart: the orgs' routes and keys live in the store: a new gateway with only rolter.toml serves
// them again after the control plane's first Reload.
func TestAPIRestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("m", "p")), 201, "")
	key, _ := e.mkKey(a, rootToken)
	tok, _ := e.mkToken(a)
	e.wantChat("m", key, 200, a+"/p")
	e.closeAPI()

	e2 := &env{t: t, dir: dir, path: e.path, A: e.A, S: e.S, logs: &syncbuf.Buffer{}}
	e2.file.Store(parseFile(t, fileConfigText(e.S.URL)))
	gw, err := engine.New(e2.file.Load(), engine.Options{Logger: slog.New(slog.NewTextHandler(e2.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = gw.Serve(ln) }()
	defer func() { _ = gw.Shutdown(context.Background()); <-done }()
	e2.gw, e2.gwURL = gw, "http://"+ln.Addr().String()
	e2.wantChat("m", key, 404, "") // rolter.toml alone
	e2.open(slog.New(slog.NewTextHandler(e2.logs, nil)))
	e2.wantChat("m", key, 200, a+"/p")
	e2.wantChat("m", "", 401, "")
	var rv routeView
	e2.api.do("GET", "/api/v1/orgs/"+a+"/routes/m", tok, nil).json(t, &rv)
	if rv.Version != 1 || rv.Targets[0].Provider != "p" {
		t.Fatalf("route after the restart %+v", rv)
	}
}

// TestAPIState: the superadmin sees every route's targets with the gateway's names and its decisions.
func TestAPIState(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", map[string]any{"model": "m", "strategy": "cache_aware", "targets": []map[string]any{{"provider": "p"}, {"provider": "shared"}}}), 201, "")
	e.wantChat("m", e.orgKey(a), 200, "")
	r := e.su("GET", "/api/v1/state", nil)
	want(t, r, 200, "")
	var st engine.State
	r.json(t, &st)
	if len(st.Routes) != 2 || st.Generation < 2 {
		t.Fatalf("state %+v", st)
	}
	i := slices.IndexFunc(st.Routes, func(rs engine.RouteState) bool { return rs.Model == "m" })
	m := st.Routes[i]
	var decisions uint64
	for _, n := range m.Decisions {
		decisions += n
	}
	if m.Org != a || m.Strategy != "cache_aware" || decisions != 1 || len(m.Targets) != 2 || m.Targets[0].Provider != a+"/p" ||
		m.Targets[1].Provider != "shared" || !m.Targets[0].Eligible || m.Targets[0].TrieNodes == nil {
		t.Fatalf("route state %+v", m)
	}
}

// TestAPIStateDisaggregation: a disaggregated route of rolter.toml shows its prefill pool as its targets
// and its protocol and decode pool apart, in the shape openapi.json describes; a short prompt skips the
// prefill pool and is counted on the decode target that served it, and in the skips by reason.
func TestAPIStateDisaggregation(t *testing.T) {
	dec0, dec1 := newUpstream(t), newUpstream(t)
	extra := fmt.Sprintf(`[[providers]]
name = "dec0"
api_base = %q
[[providers]]
name = "dec1"
api_base = %q
[[routes]]
model = "pd"
[[routes.targets]]
provider = "shared"
[routes.disaggregation]
prefill_threshold_tokens = 256
[[routes.disaggregation.decode]]
provider = "dec0"
[[routes.disaggregation.decode]]
provider = "dec1"
`, dec0.URL, dec1.URL)
	e := newEnvWith(t, filepath.Join(t.TempDir(), "rolter.db"), extra, nil)
	e.wantChat("pd", "", 200, "")
	r := e.su("GET", "/api/v1/state", nil)
	want(t, r, 200, "")
	var st engine.State
	r.json(t, &st)
	i := slices.IndexFunc(st.Routes, func(rs engine.RouteState) bool { return rs.Model == "pd" })
	if i < 0 || st.Routes[slices.IndexFunc(st.Routes, func(rs engine.RouteState) bool { return rs.Model == "pub" })].Disaggregation != nil {
		t.Fatalf("state %+v", st.Routes)
	}
	rs := st.Routes[i]
	pd := rs.Disaggregation
	if pd == nil || len(rs.Targets) != 1 || rs.Targets[0].Provider != "shared" || rs.Targets[0].Requests != 0 {
		t.Fatalf("route state %+v", rs)
	}
	if pd.Protocol != "vllm" || pd.BootstrapPort != nil || pd.Skipped["short_prompt"] != 1 || len(pd.KVParams) != 0 || len(pd.Decode) != 2 ||
		pd.Decode[0].Provider != "dec0" || pd.Decode[1].Provider != "dec1" || !pd.Decode[0].Eligible || pd.Decode[0].Requests != uint64(dec0.n.Load()) || pd.Decode[1].Requests != uint64(dec1.n.Load()) ||
		dec0.n.Load()+dec1.n.Load() != 1 || e.S.n.Load() != 0 || pd.Hops.PrefillOK != 0 {
		t.Fatalf("disaggregation %+v", pd)
	}
}

// TestAPIConcurrentWrites: writes are serialised; of concurrent replaces of one version exactly one wins.
func TestAPIConcurrentWrites(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("m", "p")), 201, "")
	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"targets": []map[string]any{{"provider": "p", "model": fmt.Sprint("up-", i)}}}
			statuses[i] = e.su("PUT", "/api/v1/orgs/"+a+"/routes/m", body, "If-Match", `"1"`).status
		}()
	}
	wg.Wait()
	slices.Sort(statuses)
	if statuses[0] != 200 || statuses[1] != 409 || statuses[n-1] != 409 {
		t.Fatalf("statuses %v, want one 200 and the rest 409", statuses)
	}
	var rv routeView
	e.su("GET", "/api/v1/orgs/"+a+"/routes/m", nil).json(t, &rv)
	if rv.Version != 2 {
		t.Fatalf("route %+v", rv)
	}
}

// TestAPIReload: Reload applies a changed rolter.toml with the store; one that collides with an org's
// route is refused with where each problem is, and the running config keeps serving.
func TestAPIReload(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("m", "p", "shared")), 201, "")

	text := fileConfigText(e.S.URL) + "[[routes]]\nmodel = \"pub2\"\n[[routes.targets]]\nprovider = \"shared\"\n"
	e.file.Store(parseFile(t, text))
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	e.wantChat("pub2", "", 200, "shared")
	e.wantChat("m", e.orgKey(a), 200, "")

	// The file routes the org's model: the file wins, and the org's route is set aside.
	text = fileConfigText(e.S.URL) + "[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"shared\"\n"
	e.file.Store(parseFile(t, text))
	if err := e.srv.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	e.wantChat("m", "", 200, "shared")
	e.wantChat("pub2", "", 404, "")

	// The file drops the shared provider the org's route uses, and no longer routes the org's model: the
	// org's route comes back, and cannot serve.
	text = strings.Replace(fileConfigText(e.B.URL), `"shared"`, `"other"`, 2)
	e.file.Store(parseFile(t, text))
	err := e.srv.Reload()
	for _, part := range []string{`org ` + a + ` route "m".targets[1].provider: unknown provider "shared"`} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Fatalf("Reload: %v, want it to contain %q", err, part)
		}
	}
	e.wantChat("m", "", 200, "shared")
}

// TestAPIUnknownPaths: what no endpoint serves is answered in the API's error shape (openapi.json's Error,
// checked here directly: these paths and methods are not operations of the document): 404 for an unknown
// path, 405 with Allow for an endpoint's path with another method.
func TestAPIUnknownPaths(t *testing.T) {
	check := spec(t)
	e := newEnv(t, "")
	f := func(method, path string, status int, code, allow string) {
		t.Helper()
		req, _ := http.NewRequest(method, e.api.base+path, nil)
		req.Header.Set("Authorization", "Bearer "+rootToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("%s %s: %s: %s", method, path, err, body)
		}
		bad, err := check.schema("Error", body)
		if err != nil {
			t.Fatalf("%s %s: cannot check the answer against openapi.json: %s", method, path, err)
		}
		if bad != "" {
			t.Fatalf("%s %s: the answer is not an Error: %s\n%s", method, path, bad, body)
		}
		r := apiResp{status: resp.StatusCode, header: resp.Header, body: body}
		want(t, r, status, code)
		if got := resp.Header.Get("Allow"); got != allow {
			t.Fatalf("%s %s: Allow %q, want %q", method, path, got, allow)
		}
	}
	f("GET", "/api/v1/nope", 404, "not_found", "")
	f("GET", "/", 404, "not_found", "")
	f("PATCH", "/api/v1/orgs", 405, "method_not_allowed", "GET, POST")
	f("POST", "/api/v1/orgs/org_x/providers/p", 405, "method_not_allowed", "GET, PUT, DELETE")
	f("POST", "/api/v1/orgs/org_x/keys/key_x", 405, "method_not_allowed", "GET, DELETE")
	f("GET", "/api/v1/orgs/org_x/keys/key_x/limits", 405, "method_not_allowed", "PUT")
}
