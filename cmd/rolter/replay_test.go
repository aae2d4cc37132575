package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReplay runs `rolter replay` on the Mooncake test trace: the table on stdout, the JSON file,
// progress on stderr.
func TestReplay(t *testing.T) {
	js := filepath.Join(t.TempDir(), "replay.json")
	var out, errb bytes.Buffer
	code := run([]string{"replay", "-trace", "../../capture/testdata/mooncake.jsonl", "-engines", "2", "-strategies", "round_robin, cache_aware",
		"-kv-blocks", "256", "-scale", "8", "-prefill-us-per-token", "5", "-decode-us-per-token", "20", "-json", js, "-timeout", "1m"}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"## Replay of `../../capture/testdata/mooncake.jsonl`", "| round_robin | ", "| cache_aware | ", "÷ oracle"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	if !strings.Contains(errb.String(), "replay: cache_aware") {
		t.Fatalf("no progress on stderr: %s", errb.String())
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Format string `json:"format"`
		Plan   struct {
			Planned int `json:"planned"`
		} `json:"plan"`
		Runs []struct {
			Strategy  string `json:"strategy"`
			Succeeded int    `json:"succeeded"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Format != "mooncake" || rep.Plan.Planned != 5 || len(rep.Runs) != 2 || rep.Runs[1].Strategy != "cache_aware" || rep.Runs[1].Succeeded != 5 {
		t.Fatalf("json: %+v", rep)
	}
}

func TestReplayFlags(t *testing.T) {
	f := func(args []string, wantCode int, wantErr string) {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(append([]string{"replay"}, args...), &out, &errb); code != wantCode || !strings.Contains(errb.String()+out.String(), wantErr) {
			t.Fatalf("%v: exit %d, stderr %q, want %d and %q", args, code, errb.String(), wantCode, wantErr)
		}
	}
	f(nil, 2, "-trace is required")
	f([]string{"-trace", "x", "extra"}, 2, `unexpected argument "extra"`)
	f([]string{"-trace", "x", "-strategies", " , "}, 2, "names no strategy")
	f([]string{"-trace", "x", "-max-requests", "0"}, 2, "must be positive")
	f([]string{"-trace", "/nonexistent/trace.jsonl"}, 1, "cannot open trace")
	f([]string{"-h"}, 0, "Usage: rolter replay -trace F")

	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"timestamp": 1, "input_length": 10, "hash_ids": [1]}`+"\n{oops\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f([]string{"-trace", bad}, 1, "line 2: cannot decode")
	f([]string{"-trace", "../../capture/testdata/mooncake.jsonl", "-engines", "100"}, 1, "engines 100 out of range 1..64")
}
