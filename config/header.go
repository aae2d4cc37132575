package config

import (
	"fmt"
	"strings"
)

// HeaderSafe reports whether s can be sent as a header value: not empty, and an RFC 9110 field value
// (fieldValueFault), so a value never ends a header or the request.
func HeaderSafe(s string) bool { return s != "" && fieldValueFault(s) == "" }

// fieldValueFault returns what makes s no RFC 9110 field value (visible characters and obs-text, with
// spaces and tabs between them), or "". A CR or LF would end the header on the wire and start another, or a
// second request.
func fieldValueFault(s string) string {
	if s != "" && (s[0] == ' ' || s[0] == '\t' || s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		return "it starts or ends with whitespace"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return fmt.Sprintf("it holds a control character (0x%02x) at byte %d; a header value is visible characters, spaces and tabs", c, i)
		}
	}
	return ""
}

func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	switch strings.ToLower(s) {
	case "host", "content-length", "transfer-encoding", "connection":
		return false
	}
	return true
}
