package control

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rolter-ai/rolter/control/store"
)

// recorder is an engine on loopback that keeps every request's headers, for checking what the gateway
// sends upstream.
type recorder struct {
	URL  string
	mu   sync.Mutex
	seen []http.Header
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rec.mu.Lock()
		rec.seen = append(rec.seen, r.Header.Clone())
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"cmpl-1","object":"chat.completion","model":"x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

// last returns the headers of the newest request (nil if none came).
func (rec *recorder) last() http.Header {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen) == 0 {
		return nil
	}
	return rec.seen[len(rec.seen)-1]
}

// anyHas reports whether any header value of any request contains s.
func (rec *recorder) anyHas(s string) bool {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, h := range rec.seen {
		for _, vs := range h {
			for _, v := range vs {
				if strings.Contains(v, s) {
					return true
				}
			}
		}
	}
	return false
}

// TestAPIOrgProviderEnvAttack: an org admin creates a provider with api_key_env = "ROLTER_ADMIN_TOKEN" and
// an api_base of its own, routes its model there and sends a data-plane request with the org's key: the
// API refuses the provider (400), and the org's listener never sees the superadmin token.
func TestAPIOrgProviderEnvAttack(t *testing.T) {
	t.Setenv("ROLTER_ADMIN_TOKEN", rootToken)
	e := newEnv(t, "")
	listener := newRecorder(t)
	org := e.mkOrg("tenant")
	tok, _ := e.mkToken(org)
	key, _ := e.mkKey(org, tok)
	base := "/api/v1/orgs/" + org
	evil := map[string]any{"name": "exfil", "api_base": listener.URL, "api_key_env": "ROLTER_ADMIN_TOKEN"}
	created := e.api.do("POST", base+"/providers", tok, evil)
	e.api.do("POST", base+"/routes", tok, route("m-exfil", "exfil"))
	e.chat("m-exfil", key)
	if listener.anyHas(rootToken) {
		t.Fatal("the org's listener received the superadmin token")
	}
	want(t, created, 400, "invalid_config", "[control] provider_env")
	delete(evil, "name")
	want(t, e.api.do("PUT", base+"/providers/exfil", tok, evil), 400, "invalid_config", "[control] provider_env")
}

// TestAPIOrgProviderEnvSideChannel: the API's answer for an unlisted variable is the same whether the
// gateway has it set (the superadmin token), set short, or not at all.
func TestAPIOrgProviderEnvSideChannel(t *testing.T) {
	t.Setenv("ROLTER_ADMIN_TOKEN", rootToken)
	t.Setenv("TEST_SHORT_VAR", "x")
	e := newEnv(t, "")
	org := e.mkOrg("tenant")
	tok, _ := e.mkToken(org)
	answer := func(name string) string {
		t.Helper()
		r := e.api.do("POST", "/api/v1/orgs/"+org+"/providers", tok, map[string]any{"name": "p", "api_base": e.A.URL, "api_key_env": name})
		return fmt.Sprintf("%d %s", r.status, strings.ReplaceAll(string(r.body), name, "VAR"))
	}
	unset := answer("TEST_NEVER_SET_VAR")
	if !strings.HasPrefix(unset, "400 ") {
		t.Fatalf("an unlisted, unset variable: %s", unset)
	}
	for _, name := range []string{"ROLTER_ADMIN_TOKEN", "TEST_SHORT_VAR"} {
		if got := answer(name); got != unset {
			t.Fatalf("%s is answered\n%s\nan unset variable\n%s", name, got, unset)
		}
	}
}

// TestAPIOrgProviderEnvAllowed: a variable the operator lists in [control] provider_env works for an org's
// provider: its value goes upstream as the bearer token.
func TestAPIOrgProviderEnvAllowed(t *testing.T) {
	t.Setenv("TEST_ORG_VLLM_KEY", "sk-vllm-for-orgs")
	e := newEnvWith(t, filepath.Join(t.TempDir(), "rolter.db"), "[control]\nenabled = true\nprovider_env = [\"TEST_ORG_VLLM_KEY\"]\n", nil)
	rec := newRecorder(t)
	org := e.mkOrg("tenant")
	base := "/api/v1/orgs/" + org
	want(t, e.su("POST", base+"/providers", map[string]any{"name": "p", "api_base": rec.URL, "api_key_env": "TEST_ORG_VLLM_KEY"}), 201, "")
	want(t, e.su("POST", base+"/routes", route("m-env", "p")), 201, "")
	e.wantChat("m-env", e.orgKey(org), 200, "")
	if got := rec.last().Get("Authorization"); got != "Bearer sk-vllm-for-orgs" {
		t.Fatalf("upstream Authorization %q", got)
	}
}

func testSecretsKey(t *testing.T) []byte {
	t.Helper()
	key := make([]byte, store.SecretsKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return key
}

// TestAPISecrets: an org sets secrets through the API and its provider sends them upstream (the API key as
// Bearer, another as a header); a new value is sent from the next request on. No answer, log or audit
// entry shows a value, and the store file holds none in plaintext.
func TestAPISecrets(t *testing.T) {
	dir := t.TempDir()
	key := testSecretsKey(t)
	e := newEnvWith(t, filepath.Join(dir, "rolter.db"), "", key)
	rec := newRecorder(t)
	org := e.mkOrg("tenant")
	tok, _ := e.mkToken(org)
	dataKey, _ := e.mkKey(org, tok)
	base := "/api/v1/orgs/" + org
	const v1, v2, hv = "sk-upstream-value-one", "sk-upstream-value-two", "header-value-three"

	want(t, e.api.do("PUT", base+"/secrets/up-key", tok, map[string]any{"value": v1}), 201, "")
	want(t, e.api.do("PUT", base+"/secrets/hdr", tok, map[string]any{"value": hv}), 201, "")
	p := map[string]any{"name": "p", "api_base": rec.URL, "api_key_secret": "up-key", "header_secrets": map[string]string{"X-Api-Key": "hdr"}}
	want(t, e.api.do("POST", base+"/providers", tok, p), 201, "")
	want(t, e.api.do("POST", base+"/routes", tok, route("m-sec", "p")), 201, "")
	e.wantChat("m-sec", dataKey, 200, "")
	if h := rec.last(); h.Get("Authorization") != "Bearer "+v1 || h.Get("X-Api-Key") != hv {
		t.Fatalf("upstream got Authorization %q, X-Api-Key %q", h.Get("Authorization"), h.Get("X-Api-Key"))
	}

	// A new value re-applies: the next request carries it.
	want(t, e.api.do("PUT", base+"/secrets/up-key", tok, map[string]any{"value": v2}), 200, "")
	e.wantChat("m-sec", dataKey, 200, "")
	if got := rec.last().Get("Authorization"); got != "Bearer "+v2 {
		t.Fatalf("after the secret changed, upstream got Authorization %q", got)
	}

	// Refused: a value a header cannot carry, a name that cannot be one, deleting a secret in use, a
	// secret another org's provider names.
	want(t, e.api.do("PUT", base+"/secrets/bad", tok, map[string]any{"value": "a\r\nX-Injected: 1"}), 400, "invalid_config")
	want(t, e.api.do("PUT", base+"/secrets/a%2Fb", tok, map[string]any{"value": "v"}), 400, "invalid_config")
	want(t, e.api.do("DELETE", base+"/secrets/up-key", tok, nil), 409, "conflict", "no secret")
	other := e.mkOrg("other")
	want(t, e.su("POST", "/api/v1/orgs/"+other+"/providers", p), 400, "invalid_config", `no secret "up-key"`)
	want(t, e.su("GET", "/api/v1/orgs/"+other+"/secrets", nil), 200, "")

	var shown bytes.Buffer
	for _, path := range []string{base + "/secrets", base + "/providers", base + "/providers/p", base + "/audit", "/api/v1/audit", "/api/v1/state"} {
		r := e.su("GET", path, nil)
		want(t, r, 200, "")
		shown.Write(r.body)
	}
	r := e.api.do("GET", base+"/secrets", tok, nil)
	if !strings.Contains(string(r.body), `"name":"up-key"`) || !strings.Contains(string(r.body), `"name":"hdr"`) {
		t.Fatalf("GET secrets: %s", r.body)
	}
	shown.Write(r.body)
	for _, v := range []string{v1, v2, hv} {
		if strings.Contains(shown.String(), v) {
			t.Fatalf("an answer shows the value %q: %s", v, shown.String())
		}
		if strings.Contains(e.logs.String(), v) {
			t.Fatalf("the log shows the value %q", v)
		}
	}

	// The store file and its write-ahead log: ciphertext only.
	for _, name := range []string{"rolter.db", "rolter.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, v := range []string{v1, v2, hv} {
			if bytes.Contains(b, []byte(v)) {
				t.Fatalf("%s holds the value %q in plaintext", name, v)
			}
		}
	}
	stored, err := e.store.Load(bg)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(stored.Secrets); n != 2 {
		t.Fatalf("%d secrets stored, want 2", n)
	}

	// Deleted once nothing names it.
	delete(p, "name")
	delete(p, "header_secrets")
	want(t, e.api.do("PUT", base+"/providers/p", tok, p), 200, "")
	want(t, e.api.do("DELETE", base+"/secrets/hdr", tok, nil), 204, "")
	want(t, e.api.do("DELETE", base+"/secrets/hdr", tok, nil), 404, "not_found")

	// Another key does not open them, and says so.
	st, err := store.Open(filepath.Join(dir, "rolter.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.UseSecretsKey(testSecretsKey(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "not the one it was stored with") {
		t.Fatalf("Load with another key: %v", err)
	}
}

// TestAPISecretsOff: without a secrets key, setting a secret is refused with the knob that turns them on,
// and a provider naming a secret is refused.
func TestAPISecretsOff(t *testing.T) {
	e := newEnv(t, "")
	org := e.mkOrg("tenant")
	base := "/api/v1/orgs/" + org
	want(t, e.su("PUT", base+"/secrets/k", map[string]any{"value": "v"}), 409, "secrets_disabled", "[control] secrets_key_env")
	want(t, e.su("POST", base+"/providers", map[string]any{"name": "p", "api_base": e.A.URL, "api_key_secret": "k"}), 400, "invalid_config", `no secret "k"`)
	want(t, e.su("GET", base+"/secrets", nil), 200, "")
}
