package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"
)

const su = "superadmin"

var bg = context.Background()

// testStore opens a new store in a temporary directory (a new PostgreSQL database under
// TestStorePostgres) with a clock that starts at 2026-01-02 and moves one second per write; it is closed at
// cleanup.
func testStore(t *testing.T) *Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rolter.db")
	if onPostgres(t) {
		path = testPostgres(t)
	}
	s := openStore(t, path)
	clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var mu sync.Mutex
	s.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	}
	return s
}

func openStore(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustOrg(t *testing.T, s *Store, name string) Org {
	t.Helper()
	o, err := s.CreateOrg(bg, su, name)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func hashOf(secret string) [32]byte { return sha256.Sum256([]byte(secret)) }

// wantErr fails unless err wraps target (nil: unless err is nil) and its text contains each of parts.
func wantErr(t *testing.T, err, target error, parts ...string) {
	t.Helper()
	if target == nil {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, target) {
		t.Fatalf("error %v; want one wrapping %v", err, target)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not say %q", err, p)
		}
	}
}

// wantVersionConflict fails unless err is a *VersionConflictError at current.
func wantVersionConflict(t *testing.T, err error, expected, current int64) {
	t.Helper()
	var vc *VersionConflictError
	if !errors.As(err, &vc) || !errors.Is(err, ErrConflict) || vc.Expected != expected || vc.Current != current {
		t.Fatalf("error %v; want a version conflict expecting %d at %d", err, expected, current)
	}
}

func count(t *testing.T, s *Store, table string) int {
	t.Helper()
	var n int
	if err := s.db.QueryRow("SELECT count(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestStoreOrgs(t *testing.T) {
	s := testStore(t)
	b := mustOrg(t, s, "beta")
	a := mustOrg(t, s, "alpha")
	if !strings.HasPrefix(a.ID, "org_") || len(a.ID) != 16 || a.ID == b.ID {
		t.Fatalf("org ids %q, %q; want distinct org_ and 12 characters", a.ID, b.ID)
	}
	if want := time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC); !a.Created.Equal(want) {
		t.Fatalf("created %s, want %s", a.Created, want)
	}
	got, err := s.GetOrg(bg, a.ID)
	if err != nil || got != a {
		t.Fatalf("GetOrg = %+v, %v; want %+v", got, err, a)
	}
	orgs, err := s.ListOrgs(bg)
	if err != nil || !reflect.DeepEqual(orgs, []Org{a, b}) {
		t.Fatalf("ListOrgs = %+v, %v; want alpha, beta", orgs, err)
	}

	_, err = s.CreateOrg(bg, su, "alpha")
	wantErr(t, err, ErrConflict, `cannot create org "alpha"`, a.ID)
	_, err = s.GetOrg(bg, "org_nope")
	wantErr(t, err, ErrNotFound, `cannot get org "org_nope"`)
	wantErr(t, s.DeleteOrg(bg, su, "org_nope"), ErrNotFound, `cannot delete org "org_nope"`)

	wantErr(t, s.DeleteOrg(bg, su, b.ID), nil)
	_, err = s.GetOrg(bg, b.ID)
	wantErr(t, err, ErrNotFound)
	if orgs, _ := s.ListOrgs(bg); len(orgs) != 1 {
		t.Fatalf("%d orgs after a delete, want 1", len(orgs))
	}
	if _, err := s.CreateOrg(bg, su, "beta"); err != nil {
		t.Fatalf("the name of a deleted org is not free again: %v", err)
	}
}

// TestStoreInvalid: what the store cannot keep is refused before anything is written.
func TestStoreInvalid(t *testing.T) {
	s := testStore(t)
	o := mustOrg(t, s, "acme")
	f := func(err error, part string) {
		t.Helper()
		wantErr(t, err, ErrInvalid, part)
	}
	_, err := s.CreateOrg(bg, su, "")
	f(err, "the org name is empty")
	_, err = s.CreateOrg(bg, su, strings.Repeat("x", 257))
	f(err, "257 bytes")
	_, err = s.CreateOrg(bg, su, "a\nb")
	f(err, "control characters")
	_, err = s.CreateOrg(bg, su, "\xff")
	f(err, "not UTF-8")
	_, err = s.CreateOrg(bg, "", "x")
	f(err, "the actor is empty")
	_, _, err = s.PutProvider(bg, su, o.ID, "p", []byte(`{"a":`), 0)
	f(err, "not JSON")
	_, _, err = s.PutProvider(bg, su, o.ID, "p", nil, 0)
	f(err, "not JSON")
	_, _, err = s.PutProvider(bg, su, o.ID, "p", []byte(`{}`), -1)
	f(err, "expected version -1")
	_, _, err = s.PutRoute(bg, su, o.ID, "", []byte(`{}`), 0)
	f(err, "the route model is empty")
	f(s.DeleteRoute(bg, su, o.ID, "m", -2), "expected version -2")
	_, err = s.CreateKey(bg, su, o.ID, "k", hashOf("a"), "", nil)
	f(err, "the key prefix is empty")
	_, err = s.CreateToken(bg, su, o.ID, "", hashOf("a"), "rt_a")
	f(err, "the token name is empty")
	_, err = s.Audit(bg, "", 0)
	f(err, "limit 0")
	if g, _ := s.Generation(bg); g != 1 {
		t.Fatalf("generation %d after refused writes, want 1", g)
	}
}

func TestStoreProviders(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	cfg1, cfg2 := []byte(`{"api_base": "http://10.0.0.1:8000", "weights": [1, 2]}`), []byte(`{"api_base":"http://10.0.0.2:8000"}`)

	created, v, err := s.PutProvider(bg, su, a.ID, "vllm", cfg1, 0)
	if err != nil || !created || v != 1 {
		t.Fatalf("PutProvider (new) = %v, %d, %v; want created at version 1", created, v, err)
	}
	p, err := s.GetProvider(bg, a.ID, "vllm")
	wantErr(t, err, nil)
	if !bytes.Equal(p.Config, cfg1) || p.Version != 1 || p.OrgID != a.ID || p.Name != "vllm" || !p.Created.Equal(p.Updated) {
		t.Fatalf("GetProvider = %+v", p)
	}
	created, v, err = s.PutProvider(bg, su, a.ID, "vllm", cfg2, 0)
	if err != nil || created || v != 2 {
		t.Fatalf("PutProvider (any) = %v, %d, %v; want replaced at version 2", created, v, err)
	}
	created, v, err = s.PutProvider(bg, su, a.ID, "vllm", cfg1, 2)
	if err != nil || created || v != 3 {
		t.Fatalf("PutProvider (expect 2) = %v, %d, %v; want replaced at version 3", created, v, err)
	}
	_, _, err = s.PutProvider(bg, su, a.ID, "vllm", cfg2, 2)
	wantVersionConflict(t, err, 2, 3)
	wantErr(t, err, ErrConflict, `cannot put provider "vllm" of org "`+a.ID+`"`, "stored version is 3")
	_, _, err = s.PutProvider(bg, su, a.ID, "new", cfg2, 1)
	wantVersionConflict(t, err, 1, 0)
	wantErr(t, s.CreateProvider(bg, su, a.ID, "vllm", cfg2), ErrConflict, "exists (version 3)")
	p2, _ := s.GetProvider(bg, a.ID, "vllm")
	if !bytes.Equal(p2.Config, cfg1) || p2.Version != 3 || !p2.Created.Equal(p.Created) || !p2.Updated.After(p.Updated) {
		t.Fatalf("after refused writes: %+v", p2)
	}

	// The same name in another org is another provider.
	wantErr(t, s.CreateProvider(bg, su, b.ID, "vllm", cfg2), nil)
	wantErr(t, s.CreateProvider(bg, su, a.ID, "alpha", cfg2), nil)
	ps, err := s.ListProviders(bg, a.ID)
	if err != nil || len(ps) != 2 || ps[0].Name != "alpha" || ps[1].Name != "vllm" || ps[1].Version != 3 {
		t.Fatalf("ListProviders = %+v, %v", ps, err)
	}

	_, err = s.GetProvider(bg, b.ID, "alpha")
	wantErr(t, err, ErrNotFound)
	_, err = s.ListProviders(bg, "org_nope")
	wantErr(t, err, ErrNotFound, `no org "org_nope"`)
	_, _, err = s.PutProvider(bg, su, "org_nope", "x", cfg1, 0)
	wantErr(t, err, ErrNotFound, `no org "org_nope"`)
	wantErr(t, s.CreateProvider(bg, su, "org_nope", "x", cfg1), ErrNotFound)

	wantVersionConflict(t, s.DeleteProvider(bg, su, a.ID, "vllm", 2), 2, 3)
	wantVersionConflict(t, s.DeleteProvider(bg, su, a.ID, "nope", 2), 2, 0)
	wantErr(t, s.DeleteProvider(bg, su, a.ID, "nope", 0), ErrNotFound)
	wantErr(t, s.DeleteProvider(bg, su, a.ID, "vllm", 3), nil)
	wantErr(t, s.DeleteProvider(bg, su, a.ID, "alpha", 0), nil)
	_, err = s.GetProvider(bg, a.ID, "vllm")
	wantErr(t, err, ErrNotFound)
	if ps, err := s.ListProviders(bg, a.ID); err != nil || len(ps) != 0 {
		t.Fatalf("ListProviders after deletes = %+v, %v", ps, err)
	}
	if _, err := s.GetProvider(bg, b.ID, "vllm"); err != nil {
		t.Fatalf("deleting org a's provider touched org b's: %v", err)
	}
	// Re-created, a provider starts again at version 1.
	if created, v, err := s.PutProvider(bg, su, a.ID, "vllm", cfg1, 0); err != nil || !created || v != 1 {
		t.Fatalf("PutProvider after delete = %v, %d, %v", created, v, err)
	}
}

func TestStoreRoutes(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	const model = "meta-llama/Llama-3.1-8B-Instruct"
	cfg := []byte(`{"strategy":"cache_aware","targets":[{"provider":"vllm"}]}`)

	wantErr(t, s.CreateRoute(bg, su, a.ID, model, cfg), nil)
	r, err := s.GetRoute(bg, a.ID, model)
	if err != nil || r.Model != model || r.OrgID != a.ID || r.Version != 1 || !bytes.Equal(r.Config, cfg) {
		t.Fatalf("GetRoute = %+v, %v", r, err)
	}
	wantErr(t, s.CreateRoute(bg, su, a.ID, model, cfg), ErrConflict, "exists (version 1)")
	// The model namespace is shared: another org can neither create nor replace, whatever it expects,
	// and does not learn whose the model is.
	err = s.CreateRoute(bg, su, b.ID, model, cfg)
	wantErr(t, err, ErrConflict, "is used by another org")
	if strings.Contains(err.Error(), a.ID) {
		t.Fatalf("the conflict names the owner: %v", err)
	}
	for _, expect := range []int64{0, 1} {
		_, _, err = s.PutRoute(bg, su, b.ID, model, cfg, expect)
		wantErr(t, err, ErrConflict, "is used by another org")
	}
	_, err = s.GetRoute(bg, b.ID, model)
	wantErr(t, err, ErrNotFound)
	wantErr(t, s.DeleteRoute(bg, su, b.ID, model, 0), ErrNotFound)

	created, v, err := s.PutRoute(bg, su, a.ID, model, []byte(`{"strategy":"round_robin"}`), 1)
	if err != nil || created || v != 2 {
		t.Fatalf("PutRoute (expect 1) = %v, %d, %v", created, v, err)
	}
	_, _, err = s.PutRoute(bg, su, a.ID, model, cfg, 1)
	wantVersionConflict(t, err, 1, 2)
	if created, v, err := s.PutRoute(bg, su, a.ID, "a-model", cfg, 0); err != nil || !created || v != 1 {
		t.Fatalf("PutRoute (new) = %v, %d, %v", created, v, err)
	}
	rs, err := s.ListRoutes(bg, a.ID)
	if err != nil || len(rs) != 2 || rs[0].Model != "a-model" || rs[1].Model != model {
		t.Fatalf("ListRoutes = %+v, %v", rs, err)
	}
	if rs, err := s.ListRoutes(bg, b.ID); err != nil || len(rs) != 0 {
		t.Fatalf("ListRoutes of b = %+v, %v", rs, err)
	}

	wantVersionConflict(t, s.DeleteRoute(bg, su, a.ID, model, 1), 1, 2)
	wantErr(t, s.DeleteRoute(bg, su, a.ID, model, 2), nil)
	// Freed, the model can be b's.
	wantErr(t, s.CreateRoute(bg, su, b.ID, model, cfg), nil)
}

func TestStoreKeysAndTokens(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")

	k1, err := s.CreateKey(bg, su, a.ID, "ci", hashOf("rk-one"), "rk-one", nil)
	wantErr(t, err, nil)
	k2, err := s.CreateKey(bg, su, a.ID, "ci", hashOf("rk-two"), "rk-two", nil) // names need not be unique
	wantErr(t, err, nil)
	if !strings.HasPrefix(k1.ID, "key_") || len(k1.ID) != 16 || k1.ID == k2.ID || k1.OrgID != a.ID || k1.Prefix != "rk-one" || !k1.Revoked.IsZero() {
		t.Fatalf("CreateKey = %+v", k1)
	}
	tok, err := s.CreateToken(bg, su, a.ID, "admin", hashOf("rt-one"), "rt-one")
	wantErr(t, err, nil)
	if !strings.HasPrefix(tok.ID, "tok_") || len(tok.ID) != 16 {
		t.Fatalf("CreateToken = %+v", tok)
	}

	// A hash is one credential: not twice a key, nor a key and a token.
	_, err = s.CreateKey(bg, su, b.ID, "dup", hashOf("rk-one"), "rk-one", nil)
	wantErr(t, err, ErrConflict, "the hash is taken")
	_, err = s.CreateToken(bg, su, b.ID, "dup", hashOf("rk-one"), "rk-one")
	wantErr(t, err, ErrConflict, "the hash is taken")
	_, err = s.CreateKey(bg, su, b.ID, "dup", hashOf("rt-one"), "rt-one", nil)
	wantErr(t, err, ErrConflict, "the hash is taken")
	_, err = s.CreateKey(bg, su, "org_nope", "k", hashOf("x"), "x", nil)
	wantErr(t, err, ErrNotFound)
	_, err = s.CreateToken(bg, su, "org_nope", "k", hashOf("x"), "x")
	wantErr(t, err, ErrNotFound)

	org, id, ok, err := s.TokenByHash(bg, hashOf("rt-one"))
	if err != nil || !ok || org != a.ID || id != tok.ID {
		t.Fatalf("TokenByHash = %q, %q, %v, %v", org, id, ok, err)
	}
	if _, _, ok, err := s.TokenByHash(bg, hashOf("rk-one")); ok || err != nil {
		t.Fatalf("a key's hash found as a token: %v, %v", ok, err)
	}

	// Revocation is scoped to the org, happens once, and is listed.
	wantErr(t, s.RevokeKey(bg, su, b.ID, k1.ID), ErrNotFound)
	wantErr(t, s.RevokeKey(bg, su, a.ID, "key_nope"), ErrNotFound)
	wantErr(t, s.RevokeKey(bg, su, a.ID, k1.ID), nil)
	wantErr(t, s.RevokeKey(bg, su, a.ID, k1.ID), ErrConflict, "revoked already")
	wantErr(t, s.RevokeToken(bg, su, b.ID, tok.ID), ErrNotFound)
	wantErr(t, s.RevokeToken(bg, su, a.ID, tok.ID), nil)
	wantErr(t, s.RevokeToken(bg, su, a.ID, tok.ID), ErrConflict)
	if _, _, ok, err := s.TokenByHash(bg, hashOf("rt-one")); ok || err != nil {
		t.Fatalf("a revoked token found: %v, %v", ok, err)
	}

	ks, err := s.ListKeys(bg, a.ID)
	if err != nil || len(ks) != 2 || ks[0].ID != k1.ID || ks[1].ID != k2.ID || ks[0].Revoked.IsZero() || !ks[1].Revoked.IsZero() {
		t.Fatalf("ListKeys = %+v, %v", ks, err)
	}
	if !ks[0].Revoked.After(ks[0].Created) {
		t.Fatalf("revoked %s, not after created %s", ks[0].Revoked, ks[0].Created)
	}
	ts, err := s.ListTokens(bg, a.ID)
	if err != nil || len(ts) != 1 || ts[0].ID != tok.ID || ts[0].Revoked.IsZero() || ts[0].Name != "admin" {
		t.Fatalf("ListTokens = %+v, %v", ts, err)
	}
	if ks, err := s.ListKeys(bg, b.ID); err != nil || len(ks) != 0 {
		t.Fatalf("ListKeys of b = %+v, %v", ks, err)
	}
	_, err = s.ListKeys(bg, "org_nope")
	wantErr(t, err, ErrNotFound)
	_, err = s.ListTokens(bg, "org_nope")
	wantErr(t, err, ErrNotFound)

	st, err := s.Load(bg)
	wantErr(t, err, nil)
	if want := []KeyHash{{Hash: hashOf("rk-two"), ID: k2.ID, OrgID: a.ID}}; !reflect.DeepEqual(st.Keys, want) {
		t.Fatalf("Load keys = %+v, want only the valid one %+v", st.Keys, want)
	}
}

// TestStoreCascade: deleting an org deletes everything of it, and of no other org, and keeps its audit.
func TestStoreCascade(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	for _, o := range []Org{a, b} {
		wantErr(t, s.CreateProvider(bg, su, o.ID, "p1", []byte(`{}`)), nil)
		wantErr(t, s.CreateProvider(bg, su, o.ID, "p2", []byte(`{}`)), nil)
		wantErr(t, s.CreateRoute(bg, su, o.ID, "model-"+o.Name, []byte(`{}`)), nil)
		_, err := s.CreateKey(bg, su, o.ID, "k", hashOf("key-"+o.Name), "k", nil)
		wantErr(t, err, nil)
		_, err = s.CreateToken(bg, su, o.ID, "t", hashOf("tok-"+o.Name), "t")
		wantErr(t, err, nil)
	}
	before := count(t, s, "audit")
	wantErr(t, s.DeleteOrg(bg, su, a.ID), nil)
	f := func(table string, want int) {
		t.Helper()
		if got := count(t, s, table); got != want {
			t.Fatalf("%d rows in %s after deleting an org, want %d", got, table, want)
		}
	}
	f("orgs", 1)
	f("providers", 2)
	f("routes", 1)
	f("keys", 1)
	f("tokens", 1)
	f("audit", before+1)
	if _, _, ok, _ := s.TokenByHash(bg, hashOf("tok-a")); ok {
		t.Fatalf("the deleted org's token still authenticates")
	}
	es, err := s.Audit(bg, a.ID, 100)
	if err != nil || len(es) != 7 {
		t.Fatalf("%d audit entries of the deleted org, %v; want 7", len(es), err)
	}
	if e := es[0]; e.Action != "delete" || e.Object != "org" || e.Name != "a" || e.Detail != a.ID+" with providers 2, routes 1, keys 1, tokens 1" {
		t.Fatalf("audit of the delete: %+v", e)
	}
	st, err := s.Load(bg)
	if err != nil || len(st.Orgs) != 1 || len(st.Providers) != 2 || len(st.Routes) != 1 || len(st.Keys) != 1 || st.Keys[0].OrgID != b.ID {
		t.Fatalf("Load after the delete = %+v, %v", st, err)
	}
}

// TestStoreAudit: every write appends one audit row and bumps the generation by one; a refused write does
// neither.
func TestStoreAudit(t *testing.T) {
	s := testStore(t)
	gen := int64(0)
	var last time.Time
	f := func(err error, actor, action, object, name, detail string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		gen++
		g, err := s.Generation(bg)
		if err != nil || g != gen {
			t.Fatalf("generation %d, %v; want %d", g, err, gen)
		}
		es, err := s.Audit(bg, "", 1)
		if err != nil || len(es) != 1 {
			t.Fatalf("Audit = %+v, %v", es, err)
		}
		e := es[0]
		if e.Generation != gen || e.Actor != actor || e.Action != action || e.Object != object || e.Name != name || e.Detail != detail {
			t.Fatalf("audit entry %+v; want generation %d, %s %s %s %q %q", e, gen, actor, action, object, name, detail)
		}
		if !e.At.After(last) { // the test clock ticks at every write, refused ones too
			t.Fatalf("audit time %s, not after the last one %s", e.At, last)
		}
		last = e.At
	}
	refused := func(err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("the write was not refused")
		}
		if g, _ := s.Generation(bg); g != gen {
			t.Fatalf("a refused write moved the generation to %d from %d", g, gen)
		}
	}
	o, err := s.CreateOrg(bg, su, "acme")
	f(err, su, "create", "org", "acme", o.ID)
	_, err = s.CreateOrg(bg, su, "acme")
	refused(err)
	tok, err := s.CreateToken(bg, su, o.ID, "ops", hashOf("t"), "rt-abc")
	f(err, su, "create", "token", tok.ID, `name "ops" prefix "rt-abc"`)
	_, _, err = s.PutProvider(bg, tok.ID, o.ID, "p", []byte(`{}`), 0)
	f(err, tok.ID, "create", "provider", "p", "version 1")
	_, _, err = s.PutProvider(bg, tok.ID, o.ID, "p", []byte(`{}`), 1)
	f(err, tok.ID, "replace", "provider", "p", "version 2")
	_, _, err = s.PutProvider(bg, tok.ID, o.ID, "p", []byte(`{}`), 1)
	refused(err)
	f(s.CreateRoute(bg, tok.ID, o.ID, "m", []byte(`{}`)), tok.ID, "create", "route", "m", "version 1")
	_, _, err = s.PutRoute(bg, tok.ID, o.ID, "m", []byte(`{}`), 0)
	f(err, tok.ID, "replace", "route", "m", "version 2")
	k, err := s.CreateKey(bg, tok.ID, o.ID, "ci", hashOf("k"), "rk-abc", nil)
	f(err, tok.ID, "create", "key", k.ID, `name "ci" prefix "rk-abc"`)
	f(s.RevokeKey(bg, tok.ID, o.ID, k.ID), tok.ID, "revoke", "key", k.ID, `name "ci"`)
	refused(s.RevokeKey(bg, tok.ID, o.ID, k.ID))
	f(s.DeleteRoute(bg, tok.ID, o.ID, "m", 0), tok.ID, "delete", "route", "m", "version 2")
	f(s.DeleteProvider(bg, tok.ID, o.ID, "p", 2), tok.ID, "delete", "provider", "p", "version 2")
	f(s.RevokeToken(bg, su, o.ID, tok.ID), su, "revoke", "token", tok.ID, `name "ops"`)
	o2, err := s.CreateOrg(bg, su, "other")
	f(err, su, "create", "org", "other", o2.ID)
	f(s.DeleteOrg(bg, su, o.ID), su, "delete", "org", "acme", o.ID+" with providers 0, routes 0, keys 1, tokens 1")

	all, err := s.Audit(bg, "", 1000)
	if err != nil || int64(len(all)) != gen {
		t.Fatalf("%d audit entries, %v; want one per write, %d", len(all), err, gen)
	}
	for i, e := range all {
		if e.Generation != gen-int64(i) || (i > 0 && e.ID >= all[i-1].ID) {
			t.Fatalf("audit not newest first at %d: %+v", i, all)
		}
	}
	of, err := s.Audit(bg, o2.ID, 1000)
	if err != nil || len(of) != 1 || of[0].OrgID != o2.ID {
		t.Fatalf("Audit of one org = %+v, %v", of, err)
	}
	if few, _ := s.Audit(bg, o.ID, 3); len(few) != 3 || few[0].Generation != gen {
		t.Fatalf("Audit with limit 3 = %+v", few)
	}
}

func TestStoreLoad(t *testing.T) {
	s := testStore(t)
	b, a := mustOrg(t, s, "b"), mustOrg(t, s, "a")
	wantErr(t, s.CreateProvider(bg, su, b.ID, "z", []byte(`{"z":1}`)), nil)
	wantErr(t, s.CreateProvider(bg, su, b.ID, "y", []byte(`{"y":1}`)), nil)
	wantErr(t, s.CreateProvider(bg, su, a.ID, "x", []byte(`{"x":1}`)), nil)
	wantErr(t, s.CreateRoute(bg, su, b.ID, "m2", []byte(`[2]`)), nil)
	wantErr(t, s.CreateRoute(bg, su, a.ID, "m1", []byte(`[1]`)), nil)
	kb, _ := s.CreateKey(bg, su, b.ID, "k", hashOf("kb"), "kb", nil)
	ka, _ := s.CreateKey(bg, su, a.ID, "k", hashOf("ka"), "ka", nil)
	_, _ = s.CreateToken(bg, su, a.ID, "t", hashOf("t"), "t")

	st, err := s.Load(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Generation != 10 || st.Pepper != s.Pepper() || st.Pepper == ([32]byte{}) {
		t.Fatalf("Load generation %d, pepper %x; want 10, %x", st.Generation, st.Pepper, s.Pepper())
	}
	if len(st.Orgs) != 2 || st.Orgs[0] != a || st.Orgs[1] != b {
		t.Fatalf("Load orgs %+v", st.Orgs)
	}
	var got []string
	for _, p := range st.Providers {
		got = append(got, p.OrgID+"/"+p.Name+"="+string(p.Config))
	}
	for _, r := range st.Routes {
		got = append(got, r.OrgID+"/"+r.Model+"="+string(r.Config))
	}
	provs := []string{a.ID + `/x={"x":1}`, b.ID + `/y={"y":1}`, b.ID + `/z={"z":1}`}
	if a.ID > b.ID {
		provs = []string{b.ID + `/y={"y":1}`, b.ID + `/z={"z":1}`, a.ID + `/x={"x":1}`}
	}
	want := append(provs, a.ID+`/m1=[1]`, b.ID+`/m2=[2]`)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Load providers and routes\n%q\nwant\n%q", got, want)
	}
	wantKeys := []KeyHash{{hashOf("ka"), ka.ID, a.ID, nil}, {hashOf("kb"), kb.ID, b.ID, nil}}
	if a.ID > b.ID {
		wantKeys[0], wantKeys[1] = wantKeys[1], wantKeys[0]
	}
	if !reflect.DeepEqual(st.Keys, wantKeys) {
		t.Fatalf("Load keys %+v, want %+v", st.Keys, wantKeys)
	}
}

// TestStoreLoadConsistent: a Load racing writes sees whole writes only: every write here creates a
// provider and bumps the generation, so a consistent read has generation = 1 + providers.
func TestStoreLoadConsistent(t *testing.T) {
	s := testStore(t)
	o := mustOrg(t, s, "o")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 100; i++ {
			if err := s.CreateProvider(bg, su, o.ID, fmt.Sprintf("p%03d", i), []byte(`{}`)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	loads := 0
	for running := true; running; loads++ {
		select {
		case <-done:
			running = false
		default:
		}
		st, err := s.Load(bg)
		if err != nil {
			t.Fatal(err)
		}
		if st.Generation != int64(1+len(st.Providers)) {
			t.Fatalf("Load at generation %d has %d providers", st.Generation, len(st.Providers))
		}
	}
	t.Logf("%d consistent loads", loads)
}

// TestStorePersistence: everything written is there after Close and Open, the pepper included.
func TestStorePersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	o := mustOrg(t, s, "acme")
	wantErr(t, s.CreateProvider(bg, su, o.ID, "p", []byte(`{"a":1}`)), nil)
	_, _, err = s.PutProvider(bg, su, o.ID, "p", []byte(`{"a":2}`), 1)
	wantErr(t, err, nil)
	wantErr(t, s.CreateRoute(bg, su, o.ID, "m", []byte(`{}`)), nil)
	_, err = s.CreateKey(bg, su, o.ID, "k", hashOf("k"), "k", nil)
	wantErr(t, err, nil)
	tok, err := s.CreateToken(bg, su, o.ID, "t", hashOf("t"), "t")
	wantErr(t, err, nil)
	before, err := s.Load(bg)
	wantErr(t, err, nil)
	auditBefore, _ := s.Audit(bg, "", 100)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Generation(bg); err == nil {
		t.Fatalf("Generation after Close did not fail")
	}

	s2 := openStore(t, path)
	after, err := s2.Load(bg)
	wantErr(t, err, nil)
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("after reopening:\n%+v\nwant\n%+v", after, before)
	}
	auditAfter, _ := s2.Audit(bg, "", 100)
	if !reflect.DeepEqual(auditBefore, auditAfter) || len(auditAfter) != 6 {
		t.Fatalf("audit after reopening:\n%+v\nwant\n%+v", auditAfter, auditBefore)
	}
	if org, id, ok, _ := s2.TokenByHash(bg, hashOf("t")); !ok || org != o.ID || id != tok.ID {
		t.Fatalf("the token is lost")
	}
	// Writes go on from the stored generation.
	_, _, err = s2.PutProvider(bg, su, o.ID, "p", []byte(`{"a":3}`), 2)
	wantErr(t, err, nil)
	if g, _ := s2.Generation(bg); g != before.Generation+1 {
		t.Fatalf("generation %d after one more write, want %d", g, before.Generation+1)
	}
}

// TestStoreConcurrentPut: of writers expecting the same version, exactly one wins; the others get the
// version conflict with the winner's version.
func TestStoreConcurrentPut(t *testing.T) {
	s := testStore(t)
	o := mustOrg(t, s, "o")
	const writers, rounds = 8, 10
	version := int64(0)
	for round := 0; round < rounds; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var wins []int64
		var conflicts int
		start := make(chan struct{})
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				cfg := fmt.Appendf(nil, `{"writer":%d}`, w)
				_, v, err := s.PutProvider(bg, su, o.ID, "p", cfg, version)
				mu.Lock()
				defer mu.Unlock()
				var vc *VersionConflictError
				switch {
				case err == nil:
					wins = append(wins, v)
				case errors.As(err, &vc) && vc.Current == version+1 && vc.Expected == version:
					conflicts++
				default:
					t.Errorf("round %d: %v", round, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if version == 0 {
			// expectVersion 0 is "any": every writer succeeds, one creating, the others replacing.
			if len(wins) != writers {
				t.Fatalf("%d of %d unconditional writers succeeded", len(wins), writers)
			}
			version = writers
			continue
		}
		if len(wins) != 1 || wins[0] != version+1 || conflicts != writers-1 {
			t.Fatalf("round %d: wins %v, %d conflicts; want exactly one win at %d", round, wins, conflicts, version+1)
		}
		version++
	}
	p, _ := s.GetProvider(bg, o.ID, "p")
	if p.Version != version {
		t.Fatalf("stored version %d, want %d", p.Version, version)
	}
	if g, _ := s.Generation(bg); g != 1+version {
		t.Fatalf("generation %d; want %d, one per successful write", g, 1+version)
	}
}

// TestStoreConcurrentWriters: writers of different objects, readers and org deletions all at once; the
// generation and the audit count every successful write once.
func TestStoreConcurrentWriters(t *testing.T) {
	s := testStore(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	writes := 0
	ok := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			writes++
		} else if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
			t.Error(err)
		}
	}
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o, err := s.CreateOrg(bg, su, fmt.Sprintf("org%d", w))
			ok(err)
			for i := 0; i < 10; i++ {
				ok(s.CreateProvider(bg, su, o.ID, fmt.Sprintf("p%d", i), []byte(`{}`)))
				ok(s.CreateRoute(bg, su, o.ID, fmt.Sprintf("m%d", i%3), []byte(`{}`))) // contested across orgs
				_, err := s.CreateKey(bg, su, o.ID, "k", hashOf(fmt.Sprintf("%d-%d", w, i)), "k", nil)
				ok(err)
				if _, err := s.Load(bg); err != nil {
					t.Error(err)
				}
			}
			if w%2 == 0 {
				ok(s.DeleteOrg(bg, su, o.ID))
			}
		}()
	}
	wg.Wait()
	g, _ := s.Generation(bg)
	if g != int64(writes) || count(t, s, "audit") != writes {
		t.Fatalf("generation %d and %d audit rows after %d successful writes", g, count(t, s, "audit"), writes)
	}
	orgs := count(t, s, "orgs")
	if orgs != 2 || count(t, s, "providers") != 10*orgs || count(t, s, "keys") != 10*orgs || count(t, s, "routes") > 3 {
		t.Fatalf("%d orgs, %d providers, %d keys, %d routes", orgs, count(t, s, "providers"), count(t, s, "keys"), count(t, s, "routes"))
	}
}

// TestStoreMigrations: migration files are numbered without gaps; a failing migration leaves the store at
// the version before it, with nothing of it applied, and the next Open applies it.
func TestStoreMigrations(t *testing.T) {
	if SchemaVersion() != 5 || migrations[0].name != "0001_init.sql" || len(pgMigrations) != SchemaVersion() {
		t.Fatalf("SchemaVersion() = %d, first migration %q", SchemaVersion(), migrations[0].name)
	}
	f := func(files []string, wantErr string) {
		t.Helper()
		fsys := fstest.MapFS{}
		for _, name := range files {
			fsys["migrations/"+name] = &fstest.MapFile{Data: []byte("SELECT 1;")}
		}
		ms, err := loadMigrations(fsys, "migrations")
		if wantErr == "" {
			if err != nil || len(ms) != len(files) {
				t.Fatalf("loadMigrations(%q) = %d, %v", files, len(ms), err)
			}
			return
		}
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("loadMigrations(%q) error %v; want %q", files, err, wantErr)
		}
	}
	f([]string{"0001_a.sql", "0002_b.sql"}, "")
	f([]string{"0001_a.sql", "0003_b.sql"}, `"0003_b.sql": want version 0002`)
	f([]string{"0002_a.sql"}, "want version 0001")
	f([]string{"0001_a.sql", "0001_b.sql"}, `"0001_b.sql": want version 0002`)
	f([]string{"1_a.sql"}, "not NNNN_name.sql")
	f([]string{"0001-a.sql"}, "not NNNN_name.sql")
	f(nil, "there are none")

	path := filepath.Join(t.TempDir(), "rolter.db")
	n := len(migrations)
	bad := append(migrations[:n:n], migration{version: n + 1, name: "0003_bad.sql",
		sql: "CREATE TABLE half (x INTEGER); ALTER TABLE orgs ADD COLUMN y INTEGER; INSERT INTO nope VALUES (1);"})
	if _, err := open(bg, path, bad); err == nil || !strings.Contains(err.Error(), `cannot apply migration "0003_bad.sql"`) {
		t.Fatalf("open with a failing migration: %v", err)
	}
	raw := rawDB(t, path)
	var v, half int
	raw.QueryRow("PRAGMA user_version").Scan(&v)
	raw.QueryRow("SELECT count(*) FROM sqlite_schema WHERE name = 'half'").Scan(&half)
	if v != n || half != 0 {
		t.Fatalf("after a failed migration: user_version %d, table of it present: %v", v, half == 1)
	}
	raw.Close()
	good := append(migrations[:n:n], migration{version: n + 1, name: "0003_good.sql", sql: "CREATE TABLE whole (x INTEGER);"})
	s, err := open(bg, path, good)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.db.QueryRow("SELECT count(*) FROM whole").Scan(&half); err != nil {
		t.Fatalf("migration 2 not applied: %v", err)
	}
}

// rawDB opens path with the driver alone, as a person with the sqlite3 shell would.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestStoreSettings: every connection has the settings durability and integrity rest on, and each store
// has its own pepper.
func TestStoreSettings(t *testing.T) {
	s := testStore(t)
	f := func(pragma, want string) {
		t.Helper()
		var got string
		if err := s.db.QueryRow("PRAGMA " + pragma).Scan(&got); err != nil || got != want {
			t.Fatalf("PRAGMA %s = %q, %v; want %q", pragma, got, err, want)
		}
	}
	f("journal_mode", "wal")
	f("synchronous", "2") // FULL
	f("foreign_keys", "1")
	f("busy_timeout", "10000")
	f("user_version", fmt.Sprint(SchemaVersion()))
	f("application_id", fmt.Sprint(applicationID))
	if s.Pepper() == ([32]byte{}) || s.Pepper() == testStore(t).Pepper() {
		t.Fatalf("pepper %x is not random", s.Pepper())
	}
}

// TestStoreTwoHandles: two stores open on one file (as two processes would be) serialise their writes
// through SQLite's lock: of two conditional writes of the same version, one wins.
func TestStoreTwoHandles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.db")
	s1, s2 := openStore(t, path), openStore(t, path)
	if s1.Pepper() != s2.Pepper() {
		t.Fatalf("two handles, two peppers")
	}
	o := mustOrg(t, s1, "o")
	for v := int64(0); v < 20; v++ {
		if v == 0 {
			wantErr(t, s2.CreateProvider(bg, su, o.ID, "p", []byte(`{}`)), nil)
			continue
		}
		errs := make(chan error, 2)
		for _, s := range []*Store{s1, s2} {
			go func() {
				_, _, err := s.PutProvider(bg, su, o.ID, "p", []byte(`{}`), v)
				errs <- err
			}()
		}
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("version %d: errors %v and %v; want exactly one winner", v, e1, e2)
		}
		if e1 == nil {
			e1 = e2
		}
		wantVersionConflict(t, e1, v, v+1)
	}
	if g, _ := s2.Generation(bg); g != 21 {
		t.Fatalf("generation %d, want 21", g)
	}
}

// TestStoreReplicas: a replica's report is upserted and listed; it is not a change (no generation, no
// audit row); a replica silent for replicaForget is forgotten.
func TestStoreReplicas(t *testing.T) {
	s := testStore(t)
	mustOrg(t, s, "o")
	f := func(want ...Replica) {
		t.Helper()
		got, err := s.Replicas(bg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			got[i].Seen = time.Time{}
		}
		if len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
			t.Fatalf("replicas %+v, want %+v", got, want)
		}
	}
	f()
	b := Replica{ID: "gw-b/1", Address: "10.0.0.2:8081", Version: "v1", Generation: 1}
	a := Replica{ID: "gw-a/1", Address: "10.0.0.1:8081", Version: "v1", Generation: 0, Error: "refused"}
	wantErr(t, s.ReportReplica(bg, b), nil)
	wantErr(t, s.ReportReplica(bg, a), nil)
	f(a, b)
	a.Generation, a.Error = 1, ""
	wantErr(t, s.ReportReplica(bg, a), nil)
	f(a, b)
	wantErr(t, s.ReportReplica(bg, Replica{}), ErrInvalid, "the replica id is empty")
	if g, _ := s.Generation(bg); g != 1 || count(t, s, "audit") != 1 {
		t.Fatalf("generation %d, %d audit rows: reports are no changes", g, count(t, s, "audit"))
	}
	// An hour and more later, a's report forgets b.
	later := s.now().Add(2 * replicaForget)
	s.now = func() time.Time { return later }
	wantErr(t, s.ReportReplica(bg, a), nil)
	f(a)
}
