package store

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits of what the store keeps; over them a write fails with ErrInvalid.
const (
	// MaxNameLen bounds the name of an org, a provider, a key, a token or a replica, and a route's model.
	MaxNameLen   = 256
	maxPrefixLen = 32
	// MaxConfigLen bounds the JSON config of a provider or a route.
	MaxConfigLen = 1 << 20
)

// CheckName refuses an empty or over-long name, one that is not UTF-8, and one with control characters.
func CheckName(what, s string, max int) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: the %s is empty", ErrInvalid, what)
	case len(s) > max:
		return fmt.Errorf("%w: the %s has %d bytes, more than %d", ErrInvalid, what, len(s), max)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: the %s %q is not UTF-8", ErrInvalid, what, s)
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return fmt.Errorf("%w: the %s %q has control characters", ErrInvalid, what, s)
	}
	return nil
}

func checkConfig(config []byte) error {
	switch {
	case len(config) > MaxConfigLen:
		return fmt.Errorf("%w: the config has %d bytes, more than %d", ErrInvalid, len(config), MaxConfigLen)
	case !json.Valid(config):
		return fmt.Errorf("%w: the config is not JSON", ErrInvalid)
	}
	return nil
}

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// newID returns prefix and 12 random base32 characters (60 bits).
func newID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error()) // rand.Read never fails since Go 1.24
	}
	return prefix + idEncoding.EncodeToString(b[:])[:12]
}

func millis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }
