//go:build !cgo

package kvindex

import (
	"errors"
	"strings"
	"testing"
)

func TestNewSubscriberNoCgo(t *testing.T) {
	s, err := NewSubscriber(NewIndex(1), nil)
	if s != nil || !errors.Is(err, ErrNoCgo) || !strings.Contains(err.Error(), "kv_events needs a cgo build with libzmq") {
		t.Fatalf("unexpected result %v, %v", s, err)
	}
}
