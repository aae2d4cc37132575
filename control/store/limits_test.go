package store

import (
	"reflect"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestStoreLimits: org limits (own and key default) and key limits are kept as set, nil for none and
// empty limits apart; each change bumps the generation and is audited; Load has them for the gateway
// (revoked keys left out, orgs without limits absent); invalid limits, missing orgs and keys, and revoked
// keys are refused with nothing written.
func TestStoreLimits(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	got, err := s.GetOrgLimits(bg, a.ID)
	if err != nil || got != (OrgLimits{OrgID: a.ID}) {
		t.Fatalf("GetOrgLimits of a new org = %+v, %v; want none", got, err)
	}
	own := &config.Limits{RPM: 600, TPM: 100000, Models: map[string]config.ModelLimits{"gpt": {RPM: 60, Concurrent: 4}}}
	keys := &config.Limits{Concurrent: 2}
	gen, _ := s.Generation(bg)
	wantErr(t, s.SetOrgLimits(bg, su, a.ID, own, keys), nil)
	if g, _ := s.Generation(bg); g != gen+1 {
		t.Fatalf("generation %d after SetOrgLimits, want %d", g, gen+1)
	}
	got, err = s.GetOrgLimits(bg, a.ID)
	if err != nil || !reflect.DeepEqual(got, OrgLimits{OrgID: a.ID, Org: own, Keys: keys}) {
		t.Fatalf("GetOrgLimits = %+v, %v; want %+v and %+v", got, err, own, keys)
	}
	es, _ := s.Audit(bg, a.ID, 1)
	if len(es) != 1 || es[0].Action != "replace" || es[0].Object != "org" || es[0].Name != "a" ||
		es[0].Detail != `limits {"rpm":600,"tpm":100000,"models":{"gpt":{"rpm":60,"concurrent":4}}}, key limits {"concurrent":2}` {
		t.Fatalf("audit %+v", es)
	}

	k1, err := s.CreateKey(bg, su, a.ID, "limited", hashOf("k1"), "k1", &config.Limits{TPM: 5000})
	wantErr(t, err, nil)
	if k1.Limits == nil || k1.Limits.TPM != 5000 {
		t.Fatalf("CreateKey limits %+v", k1.Limits)
	}
	es, _ = s.Audit(bg, a.ID, 1)
	if len(es) != 1 || es[0].Action != "create" || !strings.HasSuffix(es[0].Detail, ` limits {"tpm":5000}`) {
		t.Fatalf("audit of a key created with limits %+v", es)
	}
	k2, _ := s.CreateKey(bg, su, a.ID, "default", hashOf("k2"), "k2", nil)
	k3, _ := s.CreateKey(bg, su, a.ID, "unlimited", hashOf("k3"), "k3", nil)
	wantErr(t, s.SetKeyLimits(bg, su, a.ID, k3.ID, &config.Limits{}), nil) // its own: none, not the default
	es, _ = s.Audit(bg, a.ID, 1)
	if len(es) != 1 || es[0].Action != "replace" || es[0].Object != "key" || es[0].Name != k3.ID || es[0].Detail != "limits {}" {
		t.Fatalf("audit of SetKeyLimits %+v", es)
	}
	wantErr(t, s.SetKeyLimits(bg, su, a.ID, k1.ID, &config.Limits{RPM: 10}), nil)
	ks, err := s.ListKeys(bg, a.ID)
	if err != nil || len(ks) != 3 {
		t.Fatalf("ListKeys = %+v, %v", ks, err)
	}
	for i, want := range []*config.Limits{{RPM: 10}, nil, {}} {
		if !reflect.DeepEqual(ks[i].Limits, want) {
			t.Fatalf("key %s limits %+v, want %+v", ks[i].Name, ks[i].Limits, want)
		}
	}
	if ts, _ := s.ListTokens(bg, a.ID); len(ts) != 0 {
		t.Fatalf("tokens %+v", ts)
	}

	// Refused, with nothing written.
	gen, _ = s.Generation(bg)
	wantErr(t, s.SetOrgLimits(bg, su, a.ID, &config.Limits{RPM: -1}, &config.Limits{TPM: config.MaxLimit + 1}), ErrInvalid,
		"limits.rpm: -1 is not between 0 (no limit) and 1099511627776", "key_limits.tpm: 1099511627777 is not between")
	wantErr(t, s.SetOrgLimits(bg, su, a.ID, &config.Limits{Models: map[string]config.ModelLimits{"": {RPM: 1}}}, nil), ErrInvalid, `limits.models."": a model name`)
	wantErr(t, s.SetOrgLimits(bg, su, "org_nope", nil, nil), ErrNotFound)
	wantErr(t, s.SetKeyLimits(bg, su, a.ID, k2.ID, &config.Limits{Concurrent: -5}), ErrInvalid, "limits.concurrent: -5")
	wantErr(t, s.SetKeyLimits(bg, su, b.ID, k2.ID, nil), ErrNotFound, "has no key") // another org's key
	wantErr(t, s.SetKeyLimits(bg, su, a.ID, "key_nope", nil), ErrNotFound)
	_, err = s.CreateKey(bg, su, a.ID, "bad", hashOf("bad"), "bad", &config.Limits{RPM: -1})
	wantErr(t, err, ErrInvalid, "limits.rpm")
	if g, _ := s.Generation(bg); g != gen {
		t.Fatalf("refused writes moved the generation from %d to %d", gen, g)
	}
	wantErr(t, s.RevokeKey(bg, su, a.ID, k2.ID), nil)
	wantErr(t, s.SetKeyLimits(bg, su, a.ID, k2.ID, &config.Limits{RPM: 1}), ErrConflict, "revoked")

	wantErr(t, s.SetOrgLimits(bg, su, b.ID, nil, &config.Limits{}), nil)
	st, err := s.Load(bg)
	if err != nil {
		t.Fatal(err)
	}
	wantOrgs := []OrgLimits{{OrgID: a.ID, Org: own, Keys: keys}, {OrgID: b.ID, Keys: &config.Limits{}}}
	if a.ID > b.ID {
		wantOrgs[0], wantOrgs[1] = wantOrgs[1], wantOrgs[0]
	}
	if !reflect.DeepEqual(st.OrgLimits, wantOrgs) {
		t.Fatalf("Load org limits %+v, want %+v", st.OrgLimits, wantOrgs)
	}
	byID := map[string]*config.Limits{}
	for _, k := range st.Keys {
		byID[k.ID] = k.Limits
	}
	if len(st.Keys) != 2 || !reflect.DeepEqual(byID[k1.ID], &config.Limits{RPM: 10}) || !reflect.DeepEqual(byID[k3.ID], &config.Limits{}) {
		t.Fatalf("Load keys %+v", st.Keys)
	}

	// None of its own again: the org drops out of the state's limits.
	wantErr(t, s.SetOrgLimits(bg, su, b.ID, nil, nil), nil)
	if st, _ = s.Load(bg); len(st.OrgLimits) != 1 || st.OrgLimits[0].OrgID != a.ID {
		t.Fatalf("Load org limits %+v after clearing b's", st.OrgLimits)
	}
	es, _ = s.Audit(bg, b.ID, 1)
	if len(es) != 1 || es[0].Detail != "limits none, key limits none" {
		t.Fatalf("audit %+v", es)
	}
}

// TestStoreLimitsCorrupt: limits the store did not write (an edit of the database) fail Load with the
// object named, rather than reaching the gateway.
func TestStoreLimitsCorrupt(t *testing.T) {
	s := testStore(t)
	a := mustOrg(t, s, "a")
	if _, err := s.db.Exec(s.pool().rebind("UPDATE orgs SET key_limits = ? WHERE id = ?"), `{"rpm":-3}`, a.ID); err != nil {
		t.Fatal(err)
	}
	_, err := s.Load(bg)
	if err == nil || !strings.Contains(err.Error(), `the keys of org "`+a.ID+`" are invalid: limits.rpm: -3`) {
		t.Fatalf("Load = %v; want the invalid limits named", err)
	}
	if _, err := s.db.Exec(s.pool().rebind("UPDATE orgs SET key_limits = ? WHERE id = ?"), `{"rpm":1,"burst":2}`, a.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetOrgLimits(bg, a.ID); err == nil || !strings.Contains(err.Error(), `unknown field "burst"`) {
		t.Fatalf("GetOrgLimits = %v; want the unknown field named", err)
	}
}
