package main

import (
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"p/slow"}`,
		`{"Action":"output","Package":"p/fast","Test":"TestA","Output":"a ran\n"}`,
		`{"Action":"pass","Package":"p/fast","Test":"TestA"}`,
		`{"Action":"pass","Package":"p/fast","Elapsed":0.5}`,
		`{"Action":"output","Package":"p/slow","Test":"TestB","Output":"want 1, got 2\n"}`,
		`{"Action":"fail","Package":"p/slow","Test":"TestB"}`,
		`{"Action":"fail","Package":"p/slow","Elapsed":3}`,
		`{"Action":"skip","Package":"p/none"}`,
	}, "\n")
	var out strings.Builder
	if code := run(strings.NewReader(in), &out); code != 1 {
		t.Fatalf("exit %d with a failed package, want 1\n%s", code, out.String())
	}
	got := out.String()
	for _, want := range []string{"ok   p/fast", "--- FAIL p/slow TestB\nwant 1, got 2\n", "FAIL p/slow", "1 packages passed, 1 failed, 1 without tests", "failed: p/slow TestB"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "a ran") {
		t.Errorf("a passed test's output was shown:\n%s", got)
	}

	out.Reset()
	if code := run(strings.NewReader(`{"Action":"pass","Package":"p/fast","Elapsed":0.5}`), &out); code != 0 {
		t.Fatalf("exit %d when every package passed\n%s", code, out.String())
	}
	out.Reset()
	build := `{"ImportPath":"p/bad","Action":"build-output","Output":"x.go:1: syntax error\n"}` + "\n" +
		`{"ImportPath":"p/bad","Action":"build-fail"}` + "\n" +
		`{"Action":"fail","Package":"p/bad","FailedBuild":"p/bad"}`
	if code := run(strings.NewReader(build), &out); code != 1 || !strings.Contains(out.String(), "x.go:1: syntax error") {
		t.Fatalf("a build failure: exit %d\n%s", code, out.String())
	}
}
