package engine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/capture"
	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/sim"
)

// readTrace reads a trace file's records.
func readTrace(t *testing.T, path string) ([]capture.Record, []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var recs []capture.Record
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r capture.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("bad trace line %q: %s", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	return recs, raw
}

// TestCaptureTrace: one line per request, with the engine's usage and the decision, hashes that share
// exactly the prompts' shared blocks, and no prompt text or session id anywhere in the file.
func TestCaptureTrace(t *testing.T) {
	_, urls := simFleet(t, 2, nil)
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	t.Setenv("ROLTER_TEST_TRACE_SALT", "pepper")
	extra := fmt.Sprintf("[trace]\npath = %q\nblock_bytes = 64\nsalt_env = \"ROLTER_TEST_TRACE_SALT\"\n", path)
	gw := startGateway(t, strings.ReplaceAll(gatewayConfig("cache_aware", extra, urls...), "up-model", sim.DefaultConfig().Model))
	system := strings.Repeat("Zanzibar confidential onboarding text. ", 10)
	for i := range 6 {
		body := map[string]any{"model": "m", "max_tokens": 2, "stream": i%2 == 1, "stream_options": map[string]bool{"include_usage": true},
			"messages": []chatMsg{{Role: "system", Content: system}, {Role: "user", Content: fmt.Sprint("secret question number ", i)}}}
		b, _ := json.Marshal(body)
		resp, got := post(t, gw.URL+"/v1/chat/completions", string(b), "X-Session-Id", "session-Kilimanjaro")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, got)
		}
	}
	var recs []capture.Record
	var raw []byte
	waitFor(t, 5*time.Second, "6 trace lines", func() bool {
		recs, raw = readTrace(t, path)
		return len(recs) == 6
	})
	for _, secret := range []string{"Zanzibar", "secret question", "Kilimanjaro", "onboarding"} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Fatalf("the trace holds %q:\n%s", secret, raw)
		}
	}
	salt := uint64(0)
	{
		w := gw.g.capture.Load()
		salt = w.salt
	}
	for i, r := range recs {
		if r.Route != "m" || r.Status != 200 || r.Target == "" || r.Decision == "" || r.BlockBytes != 64 || r.Session == "" {
			t.Fatalf("line %d: %+v", i, r)
		}
		if r.In <= 0 || r.Out != 2 || r.Cached == nil {
			t.Fatalf("line %d: no usage: %+v", i, r)
		}
		if want := (r.InBytes + 63) / 64; len(r.Blocks) != want {
			t.Fatalf("line %d: %d blocks for %d bytes", i, len(r.Blocks), r.InBytes)
		}
		if i > 0 {
			// The same system prompt, then another question: the leading blocks agree, the last does not.
			a, b := recs[0].Blocks, r.Blocks
			shared := 0
			for shared < min(len(a), len(b)) && a[shared] == b[shared] {
				shared++
			}
			if shared < len(system)/64 || shared == len(b) {
				t.Fatalf("line %d shares %d of %d blocks with line 0", i, shared, len(b))
			}
		}
	}
	// The hashes are the documented chain: a replay tool holding the salt can check a guessed prompt.
	if recs[0].Session != fmt.Sprintf("%016x", capture.ChainHash(salt^sessionDomain, 0, []byte("session-Kilimanjaro"))) {
		t.Fatal("session hash is not the documented one")
	}
	_, text := getMetrics(t, gw)
	if v := metricValue(text, `rolter_trace_records_total{result="written"}`); v != 6 {
		t.Fatalf("rolter_trace_records_total written = %v", v)
	}
}

func TestCaptureRecordAllocs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	cfg := config.Default().Trace
	cfg.Path = path
	w, err := newCaptureWriter(cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	c := &call{route: &Route{Model: "m"}, key: []byte(chat20), start: time.Now()}
	w.record(c, 200)
	// At a pace the writer keeps up with, the hash arrays come back to the pool before the next request
	// (a writer that lags makes the request allocate a new one, never wait).
	if n := testing.AllocsPerRun(100, func() {
		w.record(c, 200)
		for len(w.queue) > 0 {
			runtime.Gosched()
		}
		time.Sleep(time.Millisecond)
	}); n > 0 {
		t.Fatalf("%v allocations per recorded request", n)
	}
}
