package instructions

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/bench/fleet"
)

func TestTopFuncs(t *testing.T) {
	annotated := []byte(`--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
4,000 ( 40.00%)  /usr/local/go/src/runtime/memmove_amd64.s:runtime.memmove
3,000 ( 30.00%)  /work/main/engine/usage.go:github.com/rolter-ai/rolter/engine.(*usageScan).value [/work/main/bin/rolter]
1,000 ( 10.00%)  /work/main/engine/inlined.go:github.com/rolter-ai/rolter/engine.(*usageScan).value
  500 (  5.00%)  ???:0x000000000126e6c8
 -200 ( -2.00%)  /usr/local/go/src/runtime/proc.go:runtime.sysmon
--------------------------------------------------------------------------------
-- Auto-annotated source: /work/main/engine/usage.go
9,999 ( 99.00%)  not:a.function
`)
	got := topFuncs(annotated, 10000, 10, 5)
	want := []FuncCount{
		{Func: "github.com/rolter-ai/rolter/engine.(*usageScan).value", PerRequest: 400, Share: 0.4},
		{Func: "runtime.memmove", PerRequest: 400, Share: 0.4},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("entry %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestInstructionsTiny counts a few requests of the test binary's gateway under cachegrind, and of refproxy's
// three modes: no errors, plausible counts, refproxy's function lists. (The test binary has no symbols, so no
// function list of its own.)
func TestInstructionsTiny(t *testing.T) {
	if testing.Short() || raceEnabled {
		// Under the race detector the count is the race runtime's, which varies from run to run.
		t.Skip("runs the gateway under valgrind, without the race detector")
	}
	vg, err := exec.LookPath("valgrind")
	if err != nil {
		t.Skip("valgrind not installed (make bench-instructions installs it)")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	refproxy := filepath.Join(t.TempDir(), "refproxy")
	if out, err := exec.Command("go", "build", "-o", refproxy, "../cmd/refproxy").CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/refproxy: %v\n%s", err, out)
	}
	var log strings.Builder
	rep, err := Run(context.Background(), Options{
		Rolter: self, RefProxy: refproxy, Valgrind: vg, Requests: 200, Warmup: 20, Concurrency: 2, Top: 10, Log: &log,
		upstreamAddr: startUpstream(t, fleet.UpstreamConfig{}), routingMemory: 1 << 20,
	})
	if err != nil {
		t.Fatalf("%s\n%s", err, log.String())
	}
	if len(rep.Cases) != 2 {
		t.Fatalf("%d cases", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		if c.Errors != 0 || c.PerRequest < 5000 || c.PerRequest > 1e7 {
			t.Fatalf("%s: %d errors, %.0f instructions per request\n%s", c.Name, c.Errors, c.PerRequest, log.String())
		}
	}
	if len(rep.References) != 3 {
		t.Fatalf("%d references", len(rep.References))
	}
	for _, r := range rep.References {
		// refproxy has its symbols: the function list is there.
		if r.Errors != 0 || r.PerRequest < 1000 || len(r.Top) == 0 {
			t.Fatalf("%s: %d errors, %.0f instructions per request, %d functions\n%s", r.Name, r.Errors, r.PerRequest, len(r.Top), log.String())
		}
	}
	if md := rep.Markdown(); !strings.Contains(md, "| small (") || !strings.Contains(md, "| refproxy -mode fasthttp |") {
		t.Fatalf("markdown:\n%s", md)
	}
}
