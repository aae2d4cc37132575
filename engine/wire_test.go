package engine

import (
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// What the gateway writes upstream: configured headers replace the client's, and no header value can
// break the request line framing.

// TestConfiguredHeadersReplaceClientOnes: a provider's configured header is the only value of that header
// upstream (vLLM's framework reads the first one), whatever the client sent.
func TestConfiguredHeadersReplaceClientOnes(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	cfg := strings.Replace(gatewayConfig("round_robin", "", up.URL), "api_base = ", "headers = { \"X-Team\" = \"search\" }\napi_base = ", 1)
	gw := startGateway(t, cfg)
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false), "x-team", "evil")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if _, h := up.last(); len(h.Values("X-Team")) != 1 || h.Get("X-Team") != "search" {
		t.Fatalf("upstream saw X-Team %q, want only the configured value", h.Values("X-Team"))
	}
}

// TestUpstreamWriterEmitsNoControlCharacters: a header value with CR/LF that reaches a gateway without
// validation (a config built in code) is written as one header line; the upstream sees one request.
func TestUpstreamWriterEmitsNoControlCharacters(t *testing.T) {
	var mu sync.Mutex
	var paths []string
	var evil string
	up := newRawUpstream(t, func(n int64, c net.Conn, req *http.Request, body []byte) {
		mu.Lock()
		paths = append(paths, req.URL.Path)
		if n == 1 {
			evil = req.Header.Get("X-Evil")
		}
		mu.Unlock()
		io.WriteString(c, jsonAnswer("a"))
	})
	cfg, err := config.Parse([]byte(gatewayConfig("round_robin", "", up.URL)), "test.toml")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Providers[0].Headers = map[string]string{"X-Evil": smuggle}
	gw := startGatewayConfig(t, cfg, Options{})
	if resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// A smuggled request would be read after the first was answered; give it the time of a few requests.
	if resp, body := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "hi", false)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Contains(paths, "/v1/load_lora_adapter") || len(paths) != 2 {
		t.Fatalf("the upstream read %q, want two chat requests", paths)
	}
	if !strings.Contains(evil, "POST /v1/load_lora_adapter") || strings.ContainsAny(evil, "\r\n") {
		t.Fatalf("X-Evil arrived as %q", evil)
	}
}
