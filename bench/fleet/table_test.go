package fleet

import (
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/loadtest"
)

func TestGoalsTable(t *testing.T) {
	f := func(measured string, goals []Goal, want string) {
		t.Helper()
		var b strings.Builder
		GoalsTable(&b, measured, goals)
		if b.String() != want {
			t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
		}
	}
	f("measured", nil, "| goal | target | measured | verdict |\n|---|---|---|---|\n")
	var g Goals
	g.Add("hit", ">= 2x", "2.1x (a|b)", true)
	g.Add("spread", "<= 1.5", "1.7", false)
	g.NA("burst", "<= 1.5", "not run")
	f("measured (N vs 1)", g, "| goal | target | measured (N vs 1) | verdict |\n|---|---|---|---|\n"+
		"| hit | >= 2x | 2.1x (a\\|b) | **PASS** |\n| spread | <= 1.5 | 1.7 | **MISS** |\n| burst | <= 1.5 | not run | **n/a** |\n")
}

func TestWhyNot(t *testing.T) {
	f := func(unavailable, err, want string) {
		t.Helper()
		if got := WhyNot(unavailable, err); got != want {
			t.Fatalf("WhyNot(%q, %q) = %q, want %q", unavailable, err, got, want)
		}
	}
	f("not available in this build: no cgo", "", "not available in this build: no cgo")
	f("", "boom\nstack", "failed: boom")
	f("", "a|b", "failed: a\\|b")
	f("x", "ignored", "x")
}

func TestWorkloadTable(t *testing.T) {
	f := func(numBlocks int, rows []WorkloadRow, wantRows string) {
		t.Helper()
		var b strings.Builder
		WorkloadTable(&b, numBlocks, rows)
		const head = "| scenario | workload | requests | distinct prompt blocks | reused blocks (working set) | working set ÷ one engine's KV |\n|---|---|---:|---:|---:|---:|\n"
		if b.String() != head+wantRows {
			t.Fatalf("got:\n%s\nwant:\n%s", b.String(), head+wantRows)
		}
	}
	r := &loadtest.Result{OracleBlocks: 300, OracleReused: 250, Planned: 1024}
	f(100, []WorkloadRow{{Scenario: "shared-prefix", Shape: "64 groups", Result: r}, {Scenario: "multi-turn", Shape: "8 users"}},
		"| shared-prefix | 64 groups | 1024 | 300 | 250 | 2.5 |\n| multi-turn | 8 users | 0 | 0 | 0 | 0.0 |\n")
	f(0, []WorkloadRow{{Scenario: "s", Shape: "w", Result: r}}, "| s | w | 1024 | 300 | 250 | 0.0 |\n")
}
