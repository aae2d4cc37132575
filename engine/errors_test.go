package engine

import (
	"testing"

	"github.com/rolter-ai/rolter/promptkey"
)

// TestScanErrorAnswer: a body the scanner refuses is answered 400 invalid_request_error with the scanner's
// code, param and message, and is not worth retrying.
func TestScanErrorAnswer(t *testing.T) {
	var s promptkey.Scanner
	var info promptkey.Info
	pe := s.Scan([]byte(`{"model":1}`), promptkey.Chat, nil, &info)
	if pe == nil {
		t.Fatal("scan accepted a numeric model")
	}
	e := scanError(pe)
	if e.status != 400 || e.typ != typeInvalidRequest || e.code != pe.Code || e.param != pe.Param || e.message != pe.Message || !e.noRetry {
		t.Fatalf("scanError(%+v) = %+v", pe, e)
	}
}
