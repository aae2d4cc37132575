package control

import (
	"reflect"
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

// TestComposeLimits: the keys of the composed config carry their ids and own limits, and the orgs that
// set limits of their own are in OrgLimits (the others absent: rolter.toml's [limits] applies); nothing of
// the config shares memory with the store's state.
func TestComposeLimits(t *testing.T) {
	file, err := config.Parse([]byte("[limits.org]\nrpm = 100\n"), "f.toml")
	if err != nil {
		t.Fatal(err)
	}
	own := &config.Limits{TPM: 500, Models: map[string]config.ModelLimits{"m": {RPM: 2}}}
	st := &store.State{
		Keys: []store.KeyHash{
			{OrgID: "org_a", ID: "key_1", Hash: [32]byte{1}, Limits: own},
			{OrgID: "org_a", ID: "key_2", Hash: [32]byte{2}},
		},
		OrgLimits: []store.OrgLimits{
			{OrgID: "org_a", Org: &config.Limits{RPM: 10}, Keys: &config.Limits{Concurrent: 1}},
			{OrgID: "org_b", Keys: &config.Limits{}},
		},
	}
	cfg, _, err := Compose(file, st)
	if err != nil {
		t.Fatal(err)
	}
	wantKeys := []config.DataKey{
		{Org: "org_a", ID: "key_1", Hash: [32]byte{1}, Limits: own},
		{Org: "org_a", ID: "key_2", Hash: [32]byte{2}},
	}
	if !reflect.DeepEqual(cfg.Keys, wantKeys) {
		t.Fatalf("keys %+v, want %+v", cfg.Keys, wantKeys)
	}
	wantOrgs := map[string]config.OrgLimits{
		"org_a": {Org: &config.Limits{RPM: 10}, Keys: &config.Limits{Concurrent: 1}},
		"org_b": {Keys: &config.Limits{}},
	}
	if !reflect.DeepEqual(cfg.OrgLimits, wantOrgs) {
		t.Fatalf("org limits %+v, want %+v", cfg.OrgLimits, wantOrgs)
	}
	if cfg.Keys[0].Limits == own || cfg.OrgLimits["org_a"].Org == st.OrgLimits[0].Org {
		t.Fatal("the composed limits are the state's own")
	}
	cfg.Keys[0].Limits.Models["m"] = config.ModelLimits{RPM: 99}
	if own.Models["m"].RPM != 2 {
		t.Fatal("the composed key's per-model limits share the state's map")
	}
	if cfg.Limits.Org.RPM != 100 {
		t.Fatalf("the file's [limits] org %+v", cfg.Limits.Org)
	}
	// Without any, OrgLimits is empty, whatever the file had.
	if cfg, _, _ := Compose(file, &store.State{}); len(cfg.OrgLimits) != 0 || len(cfg.Keys) != 0 {
		t.Fatalf("an empty store composes org limits %+v and keys %+v", cfg.OrgLimits, cfg.Keys)
	}
}
