package control

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/internal/freeport"
	"github.com/rolter-ai/rolter/kvindex"
)

// smuggle is a header value that ends its header and the request, and starts a second one to an engine
// path the data plane refuses.
const smuggle = "x\r\n\r\nPOST /v1/load_lora_adapter HTTP/1.1\r\nHost: engine\r\nContent-Length: 2\r\n\r\n{}"

// wantField checks that r is a 400 invalid_config naming field with a message that holds msg.
func wantField(t *testing.T, r apiResp, field, msg string) {
	t.Helper()
	e := want(t, r, 400, "invalid_config")
	for _, f := range e.Error.Fields {
		if f.Field == field && strings.Contains(f.Message, msg) {
			return
		}
	}
	t.Fatalf("fields %+v, want %s: ...%s...", e.Error.Fields, field, msg)
}

// TestAPIHeaderSmugglingRefused: an org admin's provider whose header value would smuggle a second request
// upstream is refused, naming the field, and stored nowhere.
func TestAPIHeaderSmugglingRefused(t *testing.T) {
	e := newEnv(t, "")
	org := e.mkOrg("a")
	tok, _ := e.mkToken(org)
	base := "/api/v1/orgs/" + org + "/providers"
	p := provider("p", e.A.URL)
	p["headers"] = map[string]string{"X-Evil": smuggle}
	r := e.api.do("POST", base, tok, p)
	wantField(t, r, "headers", `invalid value of header "X-Evil": it holds a control character (0x0d) at byte 1`)
	if strings.Contains(string(r.body), "load_lora") {
		t.Fatalf("the answer echoes the value: %s", r.body)
	}
	p["headers"] = map[string]string{"X-Evil": "a\x00b"}
	wantField(t, e.api.do("POST", base, tok, p), "headers", "control character (0x00)")
	// The same through PUT on a provider that exists.
	want(t, e.api.do("POST", base, tok, provider("p", e.A.URL)), 201, "")
	p["headers"] = map[string]string{"X-Evil": "a\nb"}
	wantField(t, e.api.do("PUT", base+"/p", tok, p), "headers", "control character (0x0a)")
	if st, _ := e.store.Load(bg); len(st.Providers) != 1 || strings.Contains(string(st.Providers[0].Config), "X-Evil") {
		t.Fatalf("a refused write reached the store: %+v", st.Providers)
	}
}

// TestAPISelfLoopRefused: the attack - an org's provider whose api_base is the gateway's own
// data-plane address, with the org's own data-plane key in its headers - is refused when it is written.
func TestAPISelfLoopRefused(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, filepath.Join(t.TempDir(), "rolter.db"), fmt.Sprintf("127.0.0.1:%d", port))
	org := e.mkOrg("a")
	tok, _ := e.mkToken(org)
	key, _ := e.mkKey(org, tok)
	base := "/api/v1/orgs/" + org + "/providers"
	for _, apiBase := range []string{e.gwURL, fmt.Sprintf("http://localhost:%d/v1", port), fmt.Sprintf("http://[::ffff:127.0.0.1]:%d", port)} {
		p := provider("self", apiBase)
		p["headers"] = map[string]string{"Authorization": "Bearer " + key}
		wantField(t, e.api.do("POST", base, tok, p), "api_base", "it is the gateway's own listener")
	}
	want(t, e.api.do("POST", base, tok, provider("p", e.A.URL)), 201, "")
	want(t, e.api.do("POST", "/api/v1/orgs/"+org+"/routes", tok, route("m", "p")), 201, "")
	e.wantChat("m", key, 200, "")
}

// TestAPIOrgKVEndpoints: an org admin cannot point kv_events at ipc:// or inproc:// endpoints, nor bind a
// port the operator did not list in [egress] kv_bind_ports.
func TestAPIOrgKVEndpoints(t *testing.T) {
	if !kvindex.Supported {
		t.Skip("kv_events needs cgo")
	}
	e := newEnv(t, "")
	org := e.mkOrg("a")
	tok, _ := e.mkToken(org)
	base := "/api/v1/orgs/" + org + "/providers"
	f := func(kv map[string]any, field, msg string) {
		t.Helper()
		p := provider("p", e.A.URL)
		p["kv_events"] = kv
		wantField(t, e.api.do("POST", base, tok, p), field, msg)
	}
	f(map[string]any{"endpoint": "ipc:///tmp/engine.sock"}, "kv_events.endpoint", "tcp:// endpoints only")
	f(map[string]any{"endpoint": "inproc://kv"}, "kv_events.endpoint", "tcp:// endpoints only")
	f(map[string]any{"endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": "ipc:///tmp/r"}, "kv_events.replay_endpoint", "tcp:// endpoints only")
	f(map[string]any{"endpoint": "tcp://*:5557", "mode": "bind"}, "kv_events.endpoint", "kv_bind_ports")
}
