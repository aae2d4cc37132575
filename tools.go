//go:build tools

// Package tools pins dependencies that later packages use, so `go mod tidy` keeps them meanwhile.
package tools

import (
	_ "github.com/puzpuzpuz/xsync/v3"
	_ "github.com/tsenart/vegeta/v12/lib"
	_ "gonum.org/v1/plot"
)
