package store

import (
	"errors"
	"fmt"
)

// Errors callers tell apart with errors.Is. Every error the store returns for a refused write wraps one of
// them; a *VersionConflictError wraps ErrConflict.
var (
	// ErrNotFound: the org, provider, route, key or token named does not exist (in that org).
	ErrNotFound = errors.New("not found")
	// ErrConflict: a name, model or hash is taken, a key or token is already revoked, or a conditional
	// write expected another version (then the error is a *VersionConflictError).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: an argument the store cannot keep (an empty or over-long name, a config that is not JSON).
	ErrInvalid = errors.New("invalid")
	// ErrUnavailable: the store's database cannot be reached (PostgreSQL down, restarting or cut off). Nothing
	// was read; a write may or may not have committed only when the connection broke during its commit.
	ErrUnavailable = errors.New("the store is unreachable")
)

// VersionConflictError is the conflict of a conditional write: the caller expected version Expected and
// the stored object is at Current (0 when it does not exist). errors.Is(err, ErrConflict) holds.
type VersionConflictError struct {
	Expected int64
	Current  int64
}

func (e *VersionConflictError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("conflict: expected version %d, but it does not exist", e.Expected)
	}
	return fmt.Sprintf("conflict: expected version %d, the stored version is %d", e.Expected, e.Current)
}

// Is makes errors.Is(err, ErrConflict) hold for a version conflict.
func (e *VersionConflictError) Is(target error) bool { return target == ErrConflict }
