package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
)

// Secret is an org's secret as listed: its name and times, never its value.
type Secret struct {
	OrgID   string
	Name    string
	Created time.Time
	Updated time.Time
}

// SecretValue is an org's secret as the gateway needs it (State.Secrets): its value, decrypted.
type SecretValue struct {
	OrgID string
	Name  string
	Value string
}

// ErrNoSecretsKey: the store has no key to encrypt or decrypt secrets with ([control] secrets_key_env).
var ErrNoSecretsKey = errors.New("secrets are off: the operator sets [control] secrets_key_env to the environment variable holding their key")

// SecretsKeyLen is the length of the secrets key: AES-256.
const SecretsKeyLen = 32

// ParseSecretsKey decodes the secrets key from the text of its environment variable: 32 bytes in
// standard base64 (`openssl rand -base64 32`). Its error says nothing about the text.
func ParseSecretsKey(text string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(text))
	if err != nil || len(key) != SecretsKeyLen {
		return nil, fmt.Errorf("cannot use the secrets key: want %d bytes in standard base64 (openssl rand -base64 32)", SecretsKeyLen)
	}
	return key, nil
}

// UseSecretsKey makes the store encrypt and decrypt org secrets with key (SecretsKeyLen bytes): AES-256-GCM,
// a random nonce per value, the org id and the name as additional data. Without it, secrets cannot be
// written, and a store that holds some cannot be loaded. Call it once, before any other method.
func (s *Store) UseSecretsKey(key []byte) error {
	if len(key) != SecretsKeyLen {
		return fmt.Errorf("cannot use the secrets key: want %d bytes", SecretsKeyLen)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return fmt.Errorf("cannot use the secrets key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("cannot use the secrets key: %w", err)
	}
	s.secrets = aead
	return nil
}

// HasSecretsKey reports whether the store can write secrets (UseSecretsKey).
func (s *Store) HasSecretsKey() bool { return s.secrets != nil }

// secretAD is the additional data a secret's value is sealed with: a value moved to another org or name
// does not open.
func secretAD(orgID, name string) []byte { return []byte("rolter secret\x00" + orgID + "\x00" + name) }

func (s *Store) seal(orgID, name, value string) (nonce, sealed []byte, err error) {
	if s.secrets == nil {
		return nil, nil, ErrNoSecretsKey
	}
	nonce = make([]byte, s.secrets.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, err
	}
	return nonce, s.secrets.Seal(nil, nonce, []byte(value), secretAD(orgID, name)), nil
}

func (s *Store) unseal(orgID, name string, nonce, sealed []byte) (string, error) {
	if s.secrets == nil {
		return "", fmt.Errorf("cannot decrypt secret %q of org %q: %w", name, orgID, ErrNoSecretsKey)
	}
	v, err := s.secrets.Open(nil, nonce, sealed, secretAD(orgID, name))
	if err != nil {
		return "", fmt.Errorf("cannot decrypt secret %q of org %q: the key of [control] secrets_key_env is not the one it was stored with", name, orgID)
	}
	return string(v), nil
}

// Limits of secrets.
const (
	// MaxSecretLen bounds the value of a secret, in bytes.
	MaxSecretLen = 8 << 10
	maxSecrets   = 256 // per org
)

// secretName is what a secret may be called: it appears in provider configs and URLs.
var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// CheckSecretName refuses a name a secret cannot have.
func CheckSecretName(name string) error {
	if !secretName.MatchString(name) {
		return fmt.Errorf("%w: secret name %q: want 1 to 128 letters, digits, '_', '.' or '-', starting with a letter or digit", ErrInvalid, name)
	}
	return nil
}

// PutSecret sets org orgID's secret name to value, encrypted, and says whether it was created. The audit
// row names the secret, never its value. Without a secrets key it is ErrNoSecretsKey.
func (s *Store) PutSecret(ctx context.Context, actor, orgID, name, value string) (created bool, err error) {
	if err := CheckSecretName(name); err != nil {
		return false, fmt.Errorf("cannot put secret %q of org %q: %w", name, orgID, err)
	}
	if value == "" || len(value) > MaxSecretLen {
		return false, fmt.Errorf("cannot put secret %q of org %q: %w: the value must have 1 to %d bytes", name, orgID, ErrInvalid, MaxSecretLen)
	}
	nonce, sealed, err := s.seal(orgID, name, value)
	if err != nil {
		return false, fmt.Errorf("cannot put secret %q of org %q: %w", name, orgID, err)
	}
	err = s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return audit{}, err
		}
		var n, exists int
		if err := tx.QueryRowContext(ctx, "SELECT count(*), count(*) FILTER (WHERE name = ?) FROM secrets WHERE org_id = ?", name, orgID).Scan(&n, &exists); err != nil {
			return audit{}, err
		}
		created = exists == 0
		if created && n >= maxSecrets {
			return audit{}, fmt.Errorf("%w: the org has %d secrets, the most it can have", ErrInvalid, n)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO secrets (org_id, name, nonce, value, created, updated) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (org_id, name) DO UPDATE SET nonce = excluded.nonce, value = excluded.value, updated = excluded.updated`,
			orgID, name, nonce, sealed, now, now); err != nil {
			return audit{}, err
		}
		action := "replace"
		if created {
			action = "create"
		}
		return audit{orgID: orgID, action: action, object: "secret", name: name}, nil
	})
	if err != nil {
		return false, fmt.Errorf("cannot put secret %q of org %q: %w", name, orgID, err)
	}
	return created, nil
}

// ListSecrets returns org orgID's secrets sorted by name, without their values; a missing org is
// ErrNotFound. It needs no secrets key.
func (s *Store) ListSecrets(ctx context.Context, orgID string) ([]Secret, error) {
	var out []Secret
	err := s.read(ctx, func(tx dbtx) error {
		if err := orgExists(ctx, tx, orgID); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, "SELECT name, created, updated FROM secrets WHERE org_id = ? ORDER BY name", orgID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			sc := Secret{OrgID: orgID}
			var created, updated int64
			if err := rows.Scan(&sc.Name, &created, &updated); err != nil {
				return err
			}
			sc.Created, sc.Updated = millis(created), millis(updated)
			out = append(out, sc)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("cannot list secrets of org %q: %w", orgID, err)
	}
	return out, nil
}

// DeleteSecret deletes org orgID's secret name, or is ErrNotFound.
func (s *Store) DeleteSecret(ctx context.Context, actor, orgID, name string) error {
	err := s.write(ctx, actor, func(tx dbtx, now int64) (audit, error) {
		res, err := tx.ExecContext(ctx, "DELETE FROM secrets WHERE org_id = ? AND name = ?", orgID, name)
		if err != nil {
			return audit{}, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			if err == nil {
				err = ErrNotFound
			}
			return audit{}, err
		}
		return audit{orgID: orgID, action: "delete", object: "secret", name: name}, nil
	})
	if err != nil {
		return fmt.Errorf("cannot delete secret %q of org %q: %w", name, orgID, err)
	}
	return nil
}

// loadSecrets reads and decrypts every secret, sorted by org and name.
func (s *Store) loadSecrets(ctx context.Context, tx dbtx) ([]SecretValue, error) {
	rows, err := tx.QueryContext(ctx, "SELECT org_id, name, nonce, value FROM secrets ORDER BY org_id, name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SecretValue
	for rows.Next() {
		var sv SecretValue
		var nonce, sealed []byte
		if err := rows.Scan(&sv.OrgID, &sv.Name, &nonce, &sealed); err != nil {
			return nil, err
		}
		if sv.Value, err = s.unseal(sv.OrgID, sv.Name, nonce, sealed); err != nil {
			return nil, err
		}
		out = append(out, sv)
	}
	return out, rows.Err()
}
