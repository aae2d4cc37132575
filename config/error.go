package config

import (
	"fmt"
	"strings"
)

// Error is one problem found in a config file.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
	// Quota says the problem is a budget the operator set being exceeded (server.routing_memory_bytes,
	// [control.quotas]): the control plane answers it as quota_exceeded.
	Quota bool
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.File != "" {
		b.WriteString(e.File)
		b.WriteByte(':')
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, "%d:", e.Line)
	}
	if b.Len() > 0 {
		b.WriteByte(' ')
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in a config; it is returned whole so users fix them in one pass.
type Errors []*Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}
