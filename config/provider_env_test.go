package config

import (
	"strings"
	"testing"
)

// orgProviderErrors validates the file config with one org provider added, changed by edit, and
// [control] provider_env allowed; it returns the problems of that provider, each with name replaced by
// "VAR" so that the answers for two variables can be compared.
func orgProviderErrors(t *testing.T, allowed []string, name string, edit func(*ProviderConfig)) string {
	t.Helper()
	cfg, err := Parse([]byte(gatewayConfig("round_robin", "", "http://127.0.0.1:9")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	pc := ProviderConfig{Org: "org_a", Name: "org_a/p", APIBase: "http://127.0.0.1:9"}
	edit(&pc)
	cfg.Providers = append(cfg.Providers, pc)
	cfg.Control.ProviderEnv = allowed
	var msgs []string
	for _, e := range Validate(cfg) {
		if strings.HasPrefix(e.Key, "providers[1]") {
			msgs = append(msgs, e.Key+": "+strings.ReplaceAll(e.Msg, name, "VAR"))
		}
	}
	return strings.Join(msgs, "\n")
}

// TestOrgProviderEnv: an org's provider reads only the environment variables of [control] provider_env,
// and the answer for any other one is the same whether it is set, set to the superadmin token, or unset;
// the file's providers read any variable.
func TestOrgProviderEnv(t *testing.T) {
	t.Setenv("ROLTER_ADMIN_TOKEN", "rt-superadmin-secret")
	t.Setenv("TEST_SET_SHORT", "x")
	t.Setenv("TEST_VLLM_KEY", "sk-vllm")
	const refused = "providers[1].api_key_env: cannot use environment variable \"VAR\": an org's provider reads only the variables of [control] provider_env"
	apiKeyEnv := func(name string) func(*ProviderConfig) {
		return func(pc *ProviderConfig) { pc.APIKeyEnv = name }
	}
	f := func(allowed []string, name, want string) {
		t.Helper()
		if got := orgProviderErrors(t, allowed, name, apiKeyEnv(name)); got != want {
			t.Fatalf("api_key_env %q with provider_env %q:\n%s\nwant:\n%s", name, allowed, got, want)
		}
	}
	f(nil, "ROLTER_ADMIN_TOKEN", refused)
	f(nil, "TEST_SET_SHORT", refused)
	f(nil, "TEST_NEVER_SET", refused)
	f([]string{"TEST_VLLM_KEY"}, "ROLTER_ADMIN_TOKEN", refused)
	f([]string{"TEST_VLLM_KEY"}, "TEST_VLLM_KEY", "")
	// A listed variable is the operator's to tell about.
	f([]string{"TEST_NEVER_SET"}, "TEST_NEVER_SET", "providers[1].api_key_env: environment variable \"VAR\" is not set or empty")

	// Secrets: named ones only, values a header can carry, never beside the same header or the API key.
	g := func(edit func(*ProviderConfig), want string) {
		t.Helper()
		if got := orgProviderErrors(t, nil, "UNUSED_NAME", edit); got != want {
			t.Fatalf("got\n%s\nwant\n%s", got, want)
		}
	}
	g(func(pc *ProviderConfig) { pc.APIKeySecret, pc.Secrets = "k", map[string]string{"k": "v"} }, "")
	g(func(pc *ProviderConfig) { pc.APIKeySecret = "k" }, "providers[1].api_key_secret: no secret \"k\": set it first with PUT /api/v1/orgs/{org}/secrets/k")
	g(func(pc *ProviderConfig) { pc.APIKeySecret, pc.Secrets = "k", map[string]string{"k": "a\r\nb"} },
		"providers[1].api_key_secret: cannot send secret \"k\" in a header: it is empty, holds a control character or starts or ends with whitespace")
	g(func(pc *ProviderConfig) {
		pc.Headers, pc.HeaderSecrets, pc.Secrets = map[string]string{"x-api-key": "a"}, map[string]string{"X-Api-Key": "k"}, map[string]string{"k": "v"}
	}, "providers[1].header_secrets: header \"X-Api-Key\" is set by headers too")
	g(func(pc *ProviderConfig) {
		pc.APIKeySecret, pc.HeaderSecrets, pc.Secrets = "k", map[string]string{"Authorization": "k"}, map[string]string{"k": "v"}
	}, "providers[1].header_secrets: header \"Authorization\" is the API key's: use api_key_secret alone")

	// The file's providers read any variable.
	cfg, err := Parse([]byte(gatewayConfig("round_robin", "", "http://127.0.0.1:9")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Providers[0].APIKeyEnv = "ROLTER_ADMIN_TOKEN"
	if errs := Validate(cfg); len(errs) > 0 {
		t.Fatalf("a file provider with api_key_env: %s", errs)
	}
	cfg.Providers[0].APIKeySecret = "k"
	cfg.Providers[0].HeaderSecrets = map[string]string{"X-Api-Key": "k"}
	if errs := Validate(cfg); len(errs) != 3 || !strings.Contains(errs[1].Error(), "secrets are an org's") || !strings.Contains(errs[2].Error(), "secrets are an org's") {
		t.Fatalf("a file provider naming secrets: %v", errs)
	}
	cfg.Providers[0].APIKeySecret, cfg.Providers[0].HeaderSecrets = "", nil
	cfg.Control.ProviderEnv = []string{"ROLTER_ADMIN_TOKEN"}
	if errs := Validate(cfg); len(errs) != 1 || !strings.Contains(errs[0].Error(), `cannot give "ROLTER_ADMIN_TOKEN" to orgs`) {
		t.Fatalf("provider_env listing admin_token_env: %v", errs)
	}
}

// TestOrgProviderCurveEnv: the same for kv_events.curve_secret_key_env, and no CURVE message reveals how
// long the key is: the subscriber's check of a listed variable says what a key must be, not what it is.
func TestOrgProviderCurveEnv(t *testing.T) {
	const zeroKey = "0000000000000000000000000000000000000000" // 32 zero bytes in Z85
	t.Setenv("TEST_CURVE_SHORT", "abc")
	t.Setenv("TEST_CURVE_VALID", zeroKey)
	curve := func(name string) func(*ProviderConfig) {
		return func(pc *ProviderConfig) {
			pc.KVEvents = &KVEventsConfig{Endpoint: "tcp://127.0.0.1:5557", Mode: "bind", Topic: "t",
				CurveSecretKeyEnv: name, CurveClientKeys: []string{zeroKey}}
		}
	}
	errsOf := func(allowed []string, name string) string {
		t.Helper()
		return orgProviderErrors(t, allowed, name, curve(name))
	}
	unset := errsOf(nil, "TEST_CURVE_UNSET")
	if !strings.Contains(unset, "curve_secret_key_env: cannot use environment variable \"VAR\"") {
		t.Fatalf("an unlisted curve_secret_key_env: %s", unset)
	}
	for _, name := range []string{"TEST_CURVE_SHORT", "TEST_CURVE_VALID"} {
		if got := errsOf(nil, name); got != unset {
			t.Fatalf("unlisted %s answers\n%s\nan unset one\n%s", name, got, unset)
		}
	}
	short := errsOf([]string{"TEST_CURVE_SHORT"}, "TEST_CURVE_SHORT")
	if !strings.Contains(short, "cannot use curve_secret_key: want 40 characters") || strings.Contains(short, "got") || strings.Contains(short, "abc") {
		t.Fatalf("a listed curve key of 3 characters: %s", short)
	}
}
