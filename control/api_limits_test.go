package control

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control/store/pgtest"
)

// servedOrgLimits returns the limits of org in the config e serves.
func (e *env) servedOrgLimits(org string) (config.OrgLimits, bool) {
	e.t.Helper()
	cfg := e.served.Load()
	if cfg == nil {
		e.t.Fatal("the control plane has applied no config")
	}
	ol, ok := cfg.OrgLimits[org]
	return ol, ok
}

// servedKey returns the key id in the config e serves.
func (e *env) servedKey(id string) (config.DataKey, bool) {
	e.t.Helper()
	for _, k := range e.served.Load().Keys {
		if k.ID == id {
			return k, true
		}
	}
	return config.DataKey{}, false
}

// TestAPIOrgLimits: the superadmin sets an org's limits and its keys' default, an org admin reads them but
// cannot set them (403); each change is served before the answer and audited; null (or left out) is none
// of its own, {} limits of its own that limit nothing.
func TestAPIOrgLimits(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	tokA, _ := e.mkToken(a)
	tokB, _ := e.mkToken(b)
	path := "/api/v1/orgs/" + a + "/limits"

	var v orgLimitsView
	r := e.api.do("GET", path, tokA, nil)
	want(t, r, 200, "")
	if r.json(t, &v); v != (orgLimitsView{Org: a}) || !strings.Contains(string(r.body), `"limits":null,"key_limits":null`) {
		t.Fatalf("limits of a new org %s", r.body)
	}
	body := map[string]any{
		"limits":     map[string]any{"rpm": 600, "tpm": 100000, "models": map[string]any{"m": map[string]any{"tpm": 1000, "concurrent": 2}}},
		"key_limits": map[string]any{"concurrent": 4},
	}
	want(t, e.api.do("PUT", path, tokA, body), 403, "forbidden", "superadmin only")
	if _, ok := e.servedOrgLimits(a); ok {
		t.Fatal("an org admin's refused change is served")
	}

	own := &config.Limits{RPM: 600, TPM: 100000, Models: map[string]config.ModelLimits{"m": {TPM: 1000, Concurrent: 2}}}
	keys := &config.Limits{Concurrent: 4}
	r = e.su("PUT", path, body)
	want(t, r, 200, "")
	v = orgLimitsView{}
	if r.json(t, &v); !reflect.DeepEqual(v, orgLimitsView{Org: a, Limits: own, KeyLimits: keys}) {
		t.Fatalf("PUT answered %s", r.body)
	}
	// Served before the answer: the gateway's config has them.
	if ol, ok := e.servedOrgLimits(a); !ok || !reflect.DeepEqual(ol, config.OrgLimits{Org: own, Keys: keys}) {
		t.Fatalf("served org limits %+v, %v", ol, ok)
	}
	r = e.api.do("GET", path, tokA, nil)
	want(t, r, 200, "")
	v = orgLimitsView{}
	if r.json(t, &v); !reflect.DeepEqual(v, orgLimitsView{Org: a, Limits: own, KeyLimits: keys}) {
		t.Fatalf("GET answered %s", r.body)
	}
	want(t, e.api.do("GET", path, tokB, nil), 404, "not_found") // another org's limits
	want(t, e.api.do("GET", "/api/v1/orgs/"+b+"/limits", tokB, nil), 200, "")

	var l list[auditView]
	e.su("GET", "/api/v1/orgs/"+a+"/audit?limit=1", nil).json(t, &l)
	if len(l.Data) != 1 || l.Data[0].Action != "replace" || l.Data[0].Object != "org" || l.Data[0].Actor != "superadmin" ||
		l.Data[0].Detail != `limits {"rpm":600,"tpm":100000,"models":{"m":{"tpm":1000,"concurrent":2}}}, key limits {"concurrent":4}` {
		t.Fatalf("audit %+v", l.Data)
	}

	// Left out is null: the key default goes, and {} is limits of the org's own that limit nothing.
	r = e.su("PUT", path, map[string]any{"limits": map[string]any{}})
	want(t, r, 200, "")
	if !strings.Contains(string(r.body), `"limits":{},"key_limits":null`) {
		t.Fatalf("PUT answered %s", r.body)
	}
	if ol, ok := e.servedOrgLimits(a); !ok || ol.Keys != nil || ol.Org == nil || !ol.Org.Zero() {
		t.Fatalf("served org limits %+v, %v", ol, ok)
	}
	want(t, e.su("PUT", path, map[string]any{"limits": nil, "key_limits": nil}), 200, "")
	if ol, ok := e.servedOrgLimits(a); ok {
		t.Fatalf("an org without limits of its own is served with %+v", ol)
	}

	want(t, e.su("PUT", "/api/v1/orgs/org_nope/limits", map[string]any{}), 404, "not_found", "org_nope")
	want(t, e.su("GET", "/api/v1/orgs/org_nope/limits", nil), 404, "not_found", "org_nope")
	want(t, e.su("PUT", "/api/v1/orgs/file/limits", map[string]any{}), 409, "conflict", "rolter.toml")
	want(t, e.su("GET", "/api/v1/orgs/file/limits", nil), 404, "not_found", "[limits]")
}

// TestAPIKeyLimits: a key takes limits of its own at creation and through PUT .../keys/{id}/limits, by an
// org admin too; the key's list and get show them, the gateway serves them before the answer, and a
// revoked key's limits cannot change.
func TestAPIKeyLimits(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	tokA, _ := e.mkToken(a)
	base := "/api/v1/orgs/" + a + "/keys"

	r := e.api.do("POST", base, tokA, map[string]any{"name": "limited", "limits": map[string]any{"rpm": 5, "models": map[string]any{"m": map[string]any{"rpm": 1}}}})
	want(t, r, 201, "")
	var k struct {
		keyView
		Secret string `json:"secret"`
	}
	r.json(t, &k)
	lim := &config.Limits{RPM: 5, Models: map[string]config.ModelLimits{"m": {RPM: 1}}}
	if !reflect.DeepEqual(k.Limits, lim) || k.Secret == "" {
		t.Fatalf("POST answered %s", r.body)
	}
	if dk, ok := e.servedKey(k.ID); !ok || dk.Org != a || !reflect.DeepEqual(dk.Limits, lim) {
		t.Fatalf("served key %+v, %v", dk, ok)
	}
	r = e.api.do("POST", base, tokA, map[string]any{"name": "default"})
	want(t, r, 201, "")
	if !strings.Contains(string(r.body), `"limits":null`) {
		t.Fatalf("a key without limits answered %s", r.body)
	}
	var plain keyView
	r.json(t, &plain)
	if dk, ok := e.servedKey(plain.ID); !ok || dk.Limits != nil {
		t.Fatalf("served key %+v, %v", dk, ok)
	}

	// An org admin sets a key's limits; the org's own still cap it.
	r = e.api.do("PUT", base+"/"+plain.ID+"/limits", tokA, map[string]any{"limits": map[string]any{"tpm": 2000}})
	want(t, r, 200, "")
	var got keyView
	if r.json(t, &got); got.ID != plain.ID || got.Name != "default" || !reflect.DeepEqual(got.Limits, &config.Limits{TPM: 2000}) {
		t.Fatalf("PUT answered %s", r.body)
	}
	if dk, _ := e.servedKey(plain.ID); !reflect.DeepEqual(dk.Limits, &config.Limits{TPM: 2000}) {
		t.Fatalf("served key limits %+v", dk.Limits)
	}
	r = e.api.do("GET", base+"/"+plain.ID, tokA, nil)
	want(t, r, 200, "")
	got = keyView{}
	if r.json(t, &got); !reflect.DeepEqual(got.Limits, &config.Limits{TPM: 2000}) || got.Org != a {
		t.Fatalf("GET answered %s", r.body)
	}
	var ks list[keyView]
	e.api.do("GET", base, tokA, nil).json(t, &ks)
	if len(ks.Data) != 2 || !reflect.DeepEqual(ks.Data[0].Limits, lim) || !reflect.DeepEqual(ks.Data[1].Limits, &config.Limits{TPM: 2000}) {
		t.Fatalf("keys %+v", ks.Data)
	}
	var l list[auditView]
	e.su("GET", "/api/v1/orgs/"+a+"/audit?limit=1", nil).json(t, &l)
	if len(l.Data) != 1 || l.Data[0].Action != "replace" || l.Data[0].Object != "key" || l.Data[0].Name != plain.ID || l.Data[0].Detail != `limits {"tpm":2000}` {
		t.Fatalf("audit %+v", l.Data)
	}

	// null: none of its own again.
	r = e.api.do("PUT", base+"/"+k.ID+"/limits", tokA, map[string]any{"limits": nil})
	want(t, r, 200, "")
	if !strings.Contains(string(r.body), `"limits":null`) {
		t.Fatalf("PUT answered %s", r.body)
	}
	if dk, _ := e.servedKey(k.ID); dk.Limits != nil {
		t.Fatalf("served key limits %+v, want none", dk.Limits)
	}

	want(t, e.su("PUT", "/api/v1/orgs/"+b+"/keys/"+k.ID+"/limits", map[string]any{"limits": nil}), 404, "not_found", "has no key") // another org's key
	want(t, e.su("PUT", base+"/key_nope/limits", map[string]any{"limits": nil}), 404, "not_found", "key_nope")
	want(t, e.su("GET", base+"/key_nope", nil), 404, "not_found", "key_nope")
	want(t, e.su("PUT", "/api/v1/orgs/org_nope/keys/"+k.ID+"/limits", map[string]any{"limits": nil}), 404, "not_found", "org_nope")
	want(t, e.su("PUT", "/api/v1/orgs/file/keys/"+k.ID+"/limits", map[string]any{"limits": nil}), 409, "conflict", "rolter.toml")
	want(t, e.api.do("DELETE", base+"/"+k.ID, tokA, nil), 204, "")
	want(t, e.api.do("PUT", base+"/"+k.ID+"/limits", tokA, map[string]any{"limits": map[string]any{"rpm": 1}}), 409, "conflict", "revoked")
	// A token takes no limits.
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/tokens", map[string]any{"name": "t", "limits": map[string]any{"rpm": 1}}), 400, "invalid_json", "limits: unknown field")
}

// TestAPILimitsInvalid: limits that fail config.Limits.Check, or do not fit the schema, are answered 400
// with the field named, and change nothing.
func TestAPILimitsInvalid(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	_, id := e.mkKey(a, rootToken)
	gen := e.srv.applied.Load()
	org := "/api/v1/orgs/" + a + "/limits"
	key := "/api/v1/orgs/" + a + "/keys/" + id + "/limits"
	for _, tc := range []struct {
		path  string
		body  any
		code  string
		field string
		msg   string
	}{
		{org, `{"limits":{"rpm":-1}}`, "invalid_config", "limits.rpm", "-1 is not between 0 (no limit) and 1099511627776"},
		{org, `{"key_limits":{"tpm":1099511627777}}`, "invalid_config", "key_limits.tpm", "1099511627777 is not between 0 (no limit) and 1099511627776"},
		{org, `{"limits":{"models":{"":{"rpm":1}}}}`, "invalid_config", `limits.models.""`, "a model name of 1 to 256 bytes"},
		{org, `{"limits":{"models":{"a: b":{"concurrent":-2}}}}`, "invalid_config", `limits.models."a: b".concurrent`, "-2 is not between"},
		{org, `{"limits":{"rpn":5}}`, "invalid_json", "limits.rpn", "unknown field"},
		{org, `{"key_limits":{"models":{"m":{"burst":1}}}}`, "invalid_json", "key_limits.models.m.burst", "unknown field"},
		{org, `{"limits":{"rpm":1.5}}`, "invalid_json", "limits.rpm", "must be an integer, got 1.5"},
		{org, `{"limits":{"rpm":"5"}}`, "invalid_json", "limits.rpm", "must be an integer, got a string"},
		{org, `{"limits":{"models":{"m":null}}}`, "invalid_json", "limits.models.m", "must be an object, got null"},
		{org, `{"org":"` + a + `"}`, "invalid_json", "org", "unknown field"},
		{org, `{"limits":{"rpm":1},"limits":{"rpm":2}}`, "invalid_json", "limits", "given twice"},
		{key, `{"limits":{"concurrent":-5}}`, "invalid_config", "limits.concurrent", "-5 is not between"},
		{key, `{"limits":{"rpm":1},"name":"x"}`, "invalid_json", "name", "unknown field"},
		{"/api/v1/orgs/" + a + "/keys", `{"name":"k","limits":{"tpm":-1}}`, "invalid_config", "limits.tpm", "-1 is not between"},
	} {
		method := "PUT"
		if strings.HasSuffix(tc.path, "/keys") {
			method = "POST"
		}
		er := want(t, e.su(method, tc.path, tc.body), 400, tc.code, tc.field, tc.msg)
		found := false
		for _, f := range er.Error.Fields {
			found = found || (f.Field == tc.field && strings.Contains(f.Message, tc.msg))
		}
		if !found {
			t.Fatalf("%s %s: fields %+v, want %s: %s", method, tc.body, er.Error.Fields, tc.field, tc.msg)
		}
	}
	// Every problem at once.
	er := want(t, e.su("PUT", org, `{"limits":{"rpm":-1,"tpm":-2},"key_limits":{"concurrent":-3}}`), 400, "invalid_config")
	if len(er.Error.Fields) != 3 {
		t.Fatalf("fields %+v, want 3", er.Error.Fields)
	}
	want(t, e.su("PUT", org, `[]`), 400, "invalid_json", "want a JSON object")
	want(t, e.su("PUT", org, ""), 400, "invalid_json", "empty")
	big := fmt.Sprintf(`{"limits":{"models":{"m":{"rpm":1}}},"pad":%q}`, strings.Repeat("x", maxBody))
	want(t, e.su("PUT", org, big), 400, "invalid_json", "larger than")
	if g := e.srv.applied.Load(); g != gen {
		t.Fatalf("refused changes moved the served generation from %d to %d", gen, g)
	}
	var ks list[keyView]
	e.su("GET", "/api/v1/orgs/"+a+"/keys", nil).json(t, &ks)
	if len(ks.Data) != 1 || ks.Data[0].Limits != nil {
		t.Fatalf("keys after refused changes %+v", ks.Data)
	}
}

// TestFleetLimitsReachEveryGateway: two gateways on one database; limits set through one are in the
// config the other serves within a second (notifications alone), as any change is.
func TestFleetLimitsReachEveryGateway(t *testing.T) {
	dsn := pgtest.Database(t)
	g1, g2 := newEnvAt(t, dsn), newEnvAt(t, dsn)
	g1.follow(time.Hour)
	g2.follow(time.Hour)
	a := g1.mkOrg("fleet")
	_, id := g1.mkKey(a, rootToken)
	waitServed := func(g *env, what string, ok func(*config.Config) bool) {
		t.Helper()
		deadline := time.Now().Add(converge)
		for {
			if cfg := g.served.Load(); cfg != nil && ok(cfg) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("gateway %s does not serve %s %s after the change", g.replica, what, converge)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	want(t, g1.su("PUT", "/api/v1/orgs/"+a+"/limits", map[string]any{"limits": map[string]any{"rpm": 60}}), 200, "")
	for _, g := range []*env{g1, g2} {
		waitServed(g, "the org's limits", func(cfg *config.Config) bool {
			ol, ok := cfg.OrgLimits[a]
			return ok && ol.Org != nil && ol.Org.RPM == 60 && ol.Keys == nil
		})
	}
	want(t, g2.su("PUT", "/api/v1/orgs/"+a+"/keys/"+id+"/limits", map[string]any{"limits": map[string]any{"concurrent": 3}}), 200, "")
	for _, g := range []*env{g1, g2} {
		waitServed(g, "the key's limits", func(cfg *config.Config) bool {
			for _, k := range cfg.Keys {
				if k.ID == id {
					return k.Limits != nil && k.Limits.Concurrent == 3
				}
			}
			return false
		})
	}
}

// TestAPILimitsApplyFailed: limits the gateway refuses are answered 422 and taken back out of the store:
// the org's and the key's limits before the change are stored and served again.
func TestAPILimitsApplyFailed(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	_, id := e.mkKey(a, rootToken)
	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/limits", map[string]any{"limits": map[string]any{"rpm": 10}}), 200, "")
	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/keys/"+id+"/limits", map[string]any{"limits": map[string]any{"tpm": 10}}), 200, "")
	refuse := func(cfg *config.Config) error {
		if ol := cfg.OrgLimits[a]; ol.Org != nil && ol.Org.RPM == 7 {
			return fmt.Errorf("refusing rpm 7")
		}
		for _, k := range cfg.Keys {
			if k.ID == id && k.Limits != nil && k.Limits.TPM == 7 {
				return fmt.Errorf("refusing tpm 7")
			}
		}
		return nil
	}
	e.refuse.Store(&refuse)

	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/limits", map[string]any{"limits": map[string]any{"rpm": 7}}), 422, "apply_failed", "refusing rpm 7", "the store was put back")
	var v orgLimitsView
	if e.su("GET", "/api/v1/orgs/"+a+"/limits", nil).json(t, &v); v.Limits == nil || v.Limits.RPM != 10 || v.KeyLimits != nil {
		t.Fatalf("org limits after a refused change %+v", v)
	}
	if ol, _ := e.servedOrgLimits(a); ol.Org == nil || ol.Org.RPM != 10 {
		t.Fatalf("served org limits %+v", ol)
	}

	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/keys/"+id+"/limits", map[string]any{"limits": map[string]any{"tpm": 7}}), 422, "apply_failed", "refusing tpm 7", "the store was put back")
	var k keyView
	if e.su("GET", "/api/v1/orgs/"+a+"/keys/"+id, nil).json(t, &k); k.Limits == nil || k.Limits.TPM != 10 {
		t.Fatalf("key limits after a refused change %+v", k.Limits)
	}
	if dk, _ := e.servedKey(id); dk.Limits == nil || dk.Limits.TPM != 10 {
		t.Fatalf("served key limits %+v", dk.Limits)
	}
	// The refused change and its undoing are both in the audit log, the undoing last.
	var l list[auditView]
	e.su("GET", "/api/v1/orgs/"+a+"/audit?limit=2", nil).json(t, &l)
	if len(l.Data) != 2 || l.Data[0].Detail != `limits {"tpm":10}` || l.Data[1].Detail != `limits {"tpm":7}` {
		t.Fatalf("audit %+v", l.Data)
	}
}

// TestAPILimitsEnforced: limits set through the API hold on the data plane at once: a key of 2 requests a
// minute gets its third answered 429, an org limit of 3 requests a minute caps its keys together, and
// lifting the key's limit lets the key through again up to the org's.
func TestAPILimitsEnforced(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("ma", "p")), 201, "")
	r := e.su("POST", "/api/v1/orgs/"+a+"/keys", map[string]any{"name": "k1", "limits": map[string]any{"rpm": 2}})
	want(t, r, 201, "")
	var k1 struct {
		keyView
		Secret string `json:"secret"`
	}
	r.json(t, &k1)
	k2, _ := e.mkKey(a, rootToken)
	e.wantChat("ma", k1.Secret, 200, "")
	e.wantChat("ma", k1.Secret, 200, "")
	e.wantChat("ma", k1.Secret, 429, "")
	e.wantChat("ma", k2, 200, "") // the other key has no limit of its own

	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/limits", map[string]any{"limits": map[string]any{"rpm": 3}}), 200, "")
	// The org's new limit starts full: k2 takes 3, then both keys are refused.
	for range 3 {
		e.wantChat("ma", k2, 200, "")
	}
	e.wantChat("ma", k2, 429, "")
	want(t, e.su("PUT", "/api/v1/orgs/"+a+"/keys/"+k1.ID+"/limits", map[string]any{"limits": nil}), 200, "")
	e.wantChat("ma", k1.Secret, 429, "") // the org's limit is spent
}
