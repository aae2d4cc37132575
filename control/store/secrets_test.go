package store

import (
	"crypto/rand"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

func testSecretsKey(t *testing.T) []byte {
	t.Helper()
	key := make([]byte, SecretsKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	return key
}

// TestStoreSecrets: secrets are written only with a key, listed without values, loaded decrypted, audited
// by name only, sealed to their org and name, and deleted with their org.
func TestStoreSecrets(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	_, err := s.PutSecret(bg, su, a.ID, "k", "v")
	wantErr(t, err, ErrNoSecretsKey)
	if err := s.UseSecretsKey(testSecretsKey(t)); err != nil {
		t.Fatal(err)
	}
	put := func(org, name, value string, wantCreated bool) {
		t.Helper()
		created, err := s.PutSecret(bg, su, org, name, value)
		if err != nil || created != wantCreated {
			t.Fatalf("PutSecret(%s, %s) = %v, %v; want created %v", org, name, created, err, wantCreated)
		}
	}
	put(a.ID, "k", "value-1", true)
	put(a.ID, "k", "value-2", false)
	put(b.ID, "k", "value-b", true)
	_, err = s.PutSecret(bg, su, a.ID, "a/b", "v")
	wantErr(t, err, ErrInvalid, "secret name")
	_, err = s.PutSecret(bg, su, a.ID, "e", "")
	wantErr(t, err, ErrInvalid)
	_, err = s.PutSecret(bg, su, "org_missing", "k", "v")
	wantErr(t, err, ErrNotFound)

	ls, err := s.ListSecrets(bg, a.ID)
	if err != nil || len(ls) != 1 || ls[0].Name != "k" || !ls[0].Updated.After(ls[0].Created) {
		t.Fatalf("ListSecrets = %+v, %v", ls, err)
	}
	st, err := s.Load(bg)
	if err != nil {
		t.Fatal(err)
	}
	want := []SecretValue{{a.ID, "k", "value-2"}, {b.ID, "k", "value-b"}}
	if a.ID > b.ID {
		want[0], want[1] = want[1], want[0]
	}
	if fmt.Sprint(st.Secrets) != fmt.Sprint(want) {
		t.Fatalf("Load secrets %v, want %v", st.Secrets, want)
	}
	es, err := s.Audit(bg, a.ID, 10)
	if err != nil || es[0].Object != "secret" || es[0].Action != "replace" || es[0].Name != "k" || es[1].Action != "create" {
		t.Fatalf("audit %+v, %v", es, err)
	}
	for _, e := range es {
		if strings.Contains(e.Detail, "value") {
			t.Fatalf("audit detail %q", e.Detail)
		}
	}

	// A value moved to another org does not open.
	if _, err := s.pool().ExecContext(bg, "UPDATE secrets SET value = (SELECT value FROM secrets WHERE org_id = ?), nonce = (SELECT nonce FROM secrets WHERE org_id = ?) WHERE org_id = ?", a.ID, a.ID, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(bg); err == nil || !strings.Contains(err.Error(), "cannot decrypt secret") {
		t.Fatalf("Load with a moved value: %v", err)
	}
	wantErr(t, s.DeleteSecret(bg, su, b.ID, "nope"), ErrNotFound)
	wantErr(t, s.DeleteSecret(bg, su, b.ID, "k"), nil)
	wantErr(t, s.DeleteOrg(bg, su, a.ID), nil)
	if n := count(t, s, "secrets"); n != 0 {
		t.Fatalf("%d secrets left", n)
	}
}

// TestStoreSecretsMigration: a store of schema 2 migrates to secrets with its audit log whole, and new
// audit ids go on after the old ones.
func TestStoreSecretsMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.db")
	old, err := open(bg, path, migrations[:2])
	if err != nil {
		t.Fatal(err)
	}
	o := mustOrg(t, old, "a")
	wantErr(t, old.DeleteOrg(bg, su, o.ID), nil)
	old.Close()
	s := openStore(t, path)
	o = mustOrg(t, s, "b")
	es, err := s.Audit(bg, "", 10)
	if err != nil || len(es) != 3 || es[0].ID != 3 || es[2].Name != "a" {
		t.Fatalf("audit after the migration: %+v, %v", es, err)
	}
	if err := s.UseSecretsKey(testSecretsKey(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutSecret(bg, su, o.ID, "k", "v"); err != nil {
		t.Fatal(err)
	}
}
