package control

import (
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
)

// TestComposeAndFieldErrors: an org's providers and routes join the file's under org-scoped names, a route
// names its org's providers or the file's, and validation problems come back as the fields of the object
// written.
func TestComposeAndFieldErrors(t *testing.T) {
	file, err := config.Parse([]byte(`[[providers]]
name = "shared"
api_base = "http://127.0.0.1:9001"
[[routes]]
model = "pub"
[[routes.targets]]
provider = "shared"
`), "f.toml")
	if err != nil {
		t.Fatal(err)
	}
	st := &store.State{
		Pepper: [32]byte{9},
		Providers: []store.Provider{
			{OrgID: "org_a", Name: "gpu", Config: []byte(`{"api_base":"http://127.0.0.1:9002","kv_events":{"endpoint":"tcp://169.254.169.254:5557"}}`)},
		},
		Routes: []store.Route{
			{OrgID: "org_a", Model: "a-model", Config: []byte(`{"strategy":"cache_aware","targets":[{"provider":"gpu"},{"provider":"shared"},{"provider":"nope"}]}`)},
		},
		Keys: []store.KeyHash{{OrgID: "org_a", Hash: [32]byte{1}}},
	}
	cfg, o, err := Compose(file, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Providers) != 2 || cfg.Providers[1].Name != "org_a/gpu" || cfg.Providers[1].Org != "org_a" {
		t.Fatalf("providers %+v", cfg.Providers)
	}
	tg := cfg.Routes[1].Targets
	if cfg.Routes[1].Org != "org_a" || tg[0].Provider != "org_a/gpu" || tg[1].Provider != "shared" || tg[2].Provider != "nope" {
		t.Fatalf("route %+v", cfg.Routes[1])
	}
	if len(cfg.Keys) != 1 || cfg.KeyPepper != st.Pepper || len(file.Providers) != 1 {
		t.Fatal("keys, pepper, or the file config was changed")
	}
	errs := config.Validate(cfg)
	own, other := FieldErrors(errs, o, "providers", "org_a", "gpu")
	found := false
	for _, fe := range own {
		// (A build without cgo also says kv_events needs one.)
		found = found || (fe.Field == "kv_events.endpoint" && strings.Contains(fe.Message, "block_link_local"))
	}
	if !found {
		t.Fatalf("provider field errors %+v (other %q)", own, other)
	}
	own, _ = FieldErrors(errs, o, "routes", "org_a", "a-model")
	if len(own) != 1 || own[0].Field != "targets[2].provider" || !strings.Contains(own[0].Message, `unknown provider "nope"`) {
		t.Fatalf("route field errors %+v", own)
	}
	if _, _, err := Compose(file, &store.State{Providers: []store.Provider{{OrgID: "o", Name: "x", Config: []byte(`{"api_bse":"x"}`)}}}); err == nil {
		t.Fatal("an unknown field in a stored provider was accepted")
	}
}
