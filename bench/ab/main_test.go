package ab

import (
	"net"
	"os"
	"testing"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/valyala/fasthttp"
)

// TestMain lets the test binary stand in for bin/rolter (fleet.StandIn).
func TestMain(m *testing.M) {
	fleet.StandIn()
	os.Exit(m.Run())
}

// startUpstream serves the fake upstream on a loopback port for the test's duration.
func startUpstream(t *testing.T, cfg fleet.UpstreamConfig) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: fleet.NewFakeUpstream(cfg), CloseOnShutdown: true}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}
