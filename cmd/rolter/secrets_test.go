package main

import (
	"encoding/base64"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/control/store"
)

// TestUseSecretsKey: the store gets its secrets key from the variable [control] secrets_key_env names; a
// missing or malformed key stops the start with a message that names the variable, never its value.
func TestUseSecretsKey(t *testing.T) {
	f := func(value, wantErr string) {
		t.Helper()
		db, err := store.Open(filepath.Join(t.TempDir(), "rolter.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		t.Setenv("TEST_SECRETS_KEY", value)
		err = useSecretsKey(db, "TEST_SECRETS_KEY")
		switch {
		case wantErr == "" && (err != nil || !db.HasSecretsKey()):
			t.Fatalf("key %q: %v", value, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr) || value != "" && strings.Contains(err.Error(), value)):
			t.Fatalf("key %q: error %v, want one saying %q and not the value", value, err, wantErr)
		}
	}
	const bad = `cannot read [control] secrets_key_env "TEST_SECRETS_KEY": cannot use the secrets key: want 32 bytes in standard base64`
	f("", bad)
	f("not-a-key-value", bad)
	f(base64.StdEncoding.EncodeToString([]byte("sixteen byte key")), bad)
	f(base64.StdEncoding.EncodeToString([]byte("thirty-two bytes of secrets key!")), "")
}
