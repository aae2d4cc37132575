//go:build pprof

// Profiling build: `go build -tags pprof ./cmd/rolter`, then ROLTER_PPROF=127.0.0.1:6060 serves net/http/pprof
// on that address (CPU, heap, mutex, block profiles and execution traces of a running gateway). Release builds
// leave it out.
package main

import (
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
	"runtime"
)

func init() {
	addr := os.Getenv("ROLTER_PPROF")
	if addr == "" {
		return
	}
	runtime.SetMutexProfileFraction(100)
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			fmt.Fprintf(os.Stderr, "rolter: pprof on %s: %v\n", addr, err)
		}
	}()
}
