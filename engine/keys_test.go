package engine

import (
	"crypto/sha256"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// keyedConfig is a config with a public route "pub" and two org routes, "m1" (org1) and "m2" (org2), each
// org with one data-plane key.
func keyedConfig(t testing.TB, url string) *config.Config {
	t.Helper()
	text := gatewayConfig("round_robin", "", url)
	for _, m := range []string{"m1", "m2", "pub"} {
		text += "[[routes]]\nmodel = \"" + m + "\"\n[[routes.targets]]\nprovider = \"p0\"\nmodel = \"up-model\"\n"
	}
	cfg, err := config.Parse([]byte(text), "keys.toml")
	if err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Routes {
		switch cfg.Routes[i].Model {
		case "m1":
			cfg.Routes[i].Org = "org1"
		case "m2", "m":
			cfg.Routes[i].Org = "org2"
		}
	}
	cfg.KeyPepper = [32]byte{1, 2, 3}
	cfg.Keys = []config.DataKey{{Org: "org1", Hash: keyHash(cfg.KeyPepper, "sk-one")}, {Org: "org2", Hash: keyHash(cfg.KeyPepper, "sk-two")}}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatal(errs)
	}
	return cfg
}

func keyHash(pepper [32]byte, secret string) [32]byte {
	return sha256.Sum256(append(pepper[:], secret...))
}

// TestDataPlaneKeys: an org with keys needs one on its routes (401 without), a key sees only its org's
// models (another org's is 404), public routes need none, and the upstream never sees the client's key.
func TestDataPlaneKeys(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayConfig(t, keyedConfig(t, up.URL), Options{})
	f := func(model, auth string, want int) {
		t.Helper()
		var hdr []string
		if auth != "" {
			hdr = []string{"Authorization", auth}
		}
		resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody(model, "x", false), hdr...)
		if resp.StatusCode != want {
			t.Fatalf("model %s, %q: status %d, want %d: %s", model, auth, resp.StatusCode, want, got)
		}
		switch want {
		case 401:
			assertOpenAIError(t, got, "invalid_api_key")
		case 404:
			assertOpenAIError(t, got, "model_not_found")
		case 200:
			if _, h := up.last(); h.Get("Authorization") != "" {
				t.Fatalf("the upstream saw Authorization %q", h.Get("Authorization"))
			}
		}
	}
	f("m1", "", 401)
	f("m1", "Bearer sk-wrong", 401)
	f("m1", "Basic sk-one", 401)
	f("m1", "Bearer sk-one", 200)
	f("m1", "bearer sk-one", 200)
	f("m1", "Bearer sk-two", 404)
	f("m2", "Bearer sk-two", 200)
	f("pub", "", 200)
	f("nope", "Bearer sk-one", 404)

	models := func(auth string) string {
		req, _ := http.NewRequest("GET", gw.URL+"/v1/models", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	if got := models(""); !strings.Contains(got, `"pub"`) || strings.Contains(got, `"m1"`) || strings.Contains(got, `"m2"`) {
		t.Fatalf("/v1/models without a key: %s", got)
	}
	if got := models("Bearer sk-one"); !strings.Contains(got, `"m1"`) || !strings.Contains(got, `"pub"`) || strings.Contains(got, `"m2"`) {
		t.Fatalf("/v1/models with org1's key: %s", got)
	}
	resp, err := testClient.Get(gw.URL + "/v1/models/m2")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("/v1/models/m2 without a key: %d, want 404", resp.StatusCode)
	}
}

// TestOrgProviderIsPrivate: a route cannot use another org's provider.
func TestOrgProviderIsPrivate(t *testing.T) {
	cfg := keyedConfig(t, "http://127.0.0.1:9")
	cfg.Providers[0].Org = "org1"
	errs := config.Validate(cfg)
	if len(errs) == 0 || !strings.Contains(errs.Error(), `unknown provider "p0"`) {
		t.Fatalf("a route of org2 over org1's provider: %v", errs)
	}
}

// TestOrgRoutesAlwaysNeedAKey: an org's routes need one of its keys even when it has none left: revoking
// the last key must not open them to everyone, and a revoked key is never forwarded.
func TestOrgRoutesAlwaysNeedAKey(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	cfg := keyedConfig(t, up.URL)
	cfg.Keys = cfg.Keys[1:] // org1's only key revoked
	gw := startGatewayConfig(t, cfg, Options{})
	for _, auth := range []string{"", "Bearer sk-one"} {
		var hdr []string
		if auth != "" {
			hdr = []string{"Authorization", auth}
		}
		if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m1", "x", false), hdr...); resp.StatusCode != 401 {
			t.Fatalf("org1 without keys, %q: %d %s, want 401", auth, resp.StatusCode, got)
		}
	}
	if up.requests.Load() != 0 {
		t.Fatal("a request reached the upstream")
	}
}

// TestDataPlaneKeyNeverForwarded: a client that sends its org's data-plane key to a public route (one of
// the file's, whose provider has no api_key_env, so the client's Authorization is passed on) does not
// hand the key to that upstream; an Authorization that is no data-plane key still passes.
func TestDataPlaneKeyNeverForwarded(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayConfig(t, keyedConfig(t, up.URL), Options{})
	f := func(auth, wantUpstream string) {
		t.Helper()
		resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("pub", "x", false), "Authorization", auth)
		if resp.StatusCode != 200 {
			t.Fatalf("%q: status %d: %s", auth, resp.StatusCode, got)
		}
		if _, h := up.last(); h.Get("Authorization") != wantUpstream {
			t.Fatalf("%q: the upstream saw Authorization %q, want %q", auth, h.Get("Authorization"), wantUpstream)
		}
	}
	f("Bearer sk-one", "")
	f("bearer sk-two", "")
	f("Bearer engine-own-key", "Bearer engine-own-key")
}

// TestAnonymousMetricsNameNoOrg: the data plane's anonymous GET /metrics leaves out every series labelled
// with an org's route or provider; WriteMetrics shows them to their org (and everything to MetricsAll).
func TestAnonymousMetricsNameNoOrg(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	cfg := keyedConfig(t, up.URL)
	cfg.Providers = append(cfg.Providers, config.ProviderConfig{Org: "org1", Name: "org1/secret-engine", APIBase: up.URL})
	for i := range cfg.Routes {
		if cfg.Routes[i].Model == "m1" {
			cfg.Routes[i].Targets = []config.TargetConfig{{Provider: "org1/secret-engine"}}
		}
	}
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatal(errs)
	}
	gw := startGatewayConfig(t, cfg, Options{})
	for _, c := range [][2]string{{"m1", "Bearer sk-one"}, {"m2", "Bearer sk-two"}, {"pub", ""}} {
		if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody(c[0], "x", false), "Authorization", c[1]); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c[0], resp.StatusCode, got)
		}
	}
	resp, err := testClient.Get(gw.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	scrape := string(b)
	for _, name := range []string{`"m1"`, `"m2"`, `"m"`, "secret-engine"} {
		if strings.Contains(scrape, name) {
			t.Fatalf("the anonymous scrape names %s", name)
		}
	}
	if !strings.Contains(scrape, `route="pub"`) || !strings.Contains(scrape, `target="p0"`) {
		t.Fatalf("the anonymous scrape lost the public series:\n%s", scrape)
	}
	var org1, all strings.Builder
	gw.g.WriteMetrics(&org1, "org1")
	gw.g.WriteMetrics(&all, MetricsAll)
	if !strings.Contains(org1.String(), `target="org1/secret-engine"`) || strings.Contains(org1.String(), `"m2"`) || strings.Contains(org1.String(), `"pub"`) {
		t.Fatalf("org1's metrics:\n%s", org1.String())
	}
	if !strings.Contains(all.String(), `route="m2"`) || !strings.Contains(all.String(), `route="m1"`) {
		t.Fatal("MetricsAll lacks the orgs' series")
	}
}
