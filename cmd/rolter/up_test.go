package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPDShapeSet(t *testing.T) {
	f := func(in string, prefill, decode int, ok bool) {
		t.Helper()
		var p pdShape
		err := p.Set(in)
		if (err == nil) != ok || ok && (p.prefill != prefill || p.decode != decode || p.String() != in) {
			t.Fatalf("Set(%q): %+v, %v; want %d:%d ok=%v", in, p, err, prefill, decode, ok)
		}
	}
	f("2:2", 2, 2, true)
	f("1:3", 1, 3, true)
	f("0:2", 0, 0, false)
	f("2:0", 0, 0, false)
	f("2", 0, 0, false)
	f("a:b", 0, 0, false)
	f("2:2:2", 0, 0, false)
}

// TestUpPD runs `rolter up -pd 2:2`, sends the request it suggests (prefilled on a prefill engine, generated on
// a decode engine) and a short one (prefilled by its decode engine), and stops it with SIGINT.
func TestUpPD(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "up.toml")
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- up([]string{"-pd", "2:2", "-strategy", "cache_aware", "-listen", "127.0.0.1:0", "-config-out", cfgPath}, pw, io.Discard)
		pw.Close()
	}()
	banner := readBanner(t, pr)
	url := regexp.MustCompile(`gateway\s+(http://\S+)/v1`).FindStringSubmatch(banner)
	req := regexp.MustCompile(`-d @(\S+)`).FindStringSubmatch(banner)
	if url == nil || req == nil || strings.Count(banner, "prefill ") < 2 || !strings.Contains(banner, "decode 2") {
		t.Fatalf("no gateway URL, request file or engines in:\n%s", banner)
	}
	cfg, err := os.ReadFile(cfgPath)
	if err != nil || !strings.Contains(string(cfg), "[routes.disaggregation]") {
		t.Fatalf("config %v:\n%s", err, cfg)
	}
	long, err := os.ReadFile(req[1])
	if err != nil {
		t.Fatal(err)
	}
	short, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": []map[string]string{{"role": "user", "content": TryItPrompt}}})
	f := func(body []byte, prefill, skipped string) {
		t.Helper()
		resp, err := http.Post(url[1]+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		pt, st, dt := resp.Header.Get("X-Rolter-Prefill-Target"), resp.Header.Get("X-Rolter-Prefill-Skipped"), resp.Header.Get("X-Rolter-Target")
		if resp.StatusCode != 200 || !strings.Contains(string(b), "chat.completion") {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		if !strings.HasPrefix(pt, prefill) || prefill == "" && pt != "" || st != skipped || !strings.HasPrefix(dt, "decode-") {
			t.Fatalf("prefill target %q, skipped %q, target %q; want prefill %q, skipped %q, a decode target", pt, st, dt, prefill, skipped)
		}
	}
	f(long, "prefill-", "")
	f(short, "", "short_prompt")
	syscall.Kill(os.Getpid(), syscall.SIGINT)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("up exited %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("up did not stop on SIGINT")
	}
}

// readBanner reads `rolter up`'s output up to its last line and discards the rest.
func readBanner(t *testing.T, r io.Reader) string {
	t.Helper()
	br := bufio.NewReader(r)
	var banner strings.Builder
	for {
		line, err := br.ReadString('\n')
		banner.WriteString(line)
		if err != nil {
			t.Fatalf("up exited early: %s", banner.String())
		}
		if strings.Contains(line, "Ctrl-C stops everything") {
			break
		}
	}
	go io.Copy(io.Discard, br)
	return banner.String()
}
