package engine

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOpenAINodeSDK drives the gateway with the official OpenAI Node SDK (npm package "openai", installed
// into engine/testdata/sdk by `make deps`): a chat completion, one read with its headers, a streamed one with
// usage, the model list, an unknown model raising NotFoundError, and a stream dying mid-way raising APIError.
// `make test` sets ROLTER_REQUIRE_SDK=1 so a missing Node.js or SDK fails instead of skipping.
func TestOpenAINodeSDK(t *testing.T) {
	up := newFakeUpstream(t, openAIUpstream)
	cfg := gatewayConfig("round_robin", "", up.URL) + `
[[routes]]
model = "dying"
[[routes.targets]]
provider = "p0"
model = "dying"
`
	res, out := runNodeSDK(t, startGateway(t, cfg).URL)
	if res.Chat != "Hello there" || res.Target != "p0" || res.StreamText != "Hello there" || res.Usage.Total_tokens != 7 ||
		res.NotFound.Status != 404 || res.NotFound.Code != "model_not_found" || res.MidStream.Name == "" {
		t.Fatalf("unexpected SDK results: %s", out)
	}
}

// sdkResults is what sdk.mjs found.
type sdkResults struct {
	Chat, Target, StreamText string
	Chunks                   int
	Usage                    struct{ Total_tokens int }
	Models                   []string
	NotFound                 struct {
		Status int
		Code   string
	}
	MidStream struct{ Name string }
}

// runNodeSDK runs sdk.mjs against the gateway at url: its route "m" answers, and "dying" is a stream that
// breaks after its first chunk.
func runNodeSDK(t *testing.T, url string) (sdkResults, string) {
	t.Helper()
	node, dir := nodeSDK(t)
	cmd := exec.Command(node, filepath.Join(dir, "sdk.mjs"), url+"/v1")
	cmd.Dir = dir
	outb, err := cmd.CombinedOutput()
	out := strings.TrimSpace(string(outb))
	if err != nil {
		t.Fatalf("sdk.mjs failed: %s\n%s", err, out)
	}
	var res sdkResults
	if err := json.Unmarshal([]byte(out[strings.LastIndex(out, "\n")+1:]), &res); err != nil {
		t.Fatalf("cannot parse sdk output: %s\n%s", err, out)
	}
	return res, out
}

// nodeSDK returns Node.js and the directory the OpenAI Node SDK is installed in (testdata/sdk), skipping
// the test when either is missing - or failing it under ROLTER_REQUIRE_SDK, as `make test` runs.
func nodeSDK(t *testing.T) (node, dir string) {
	t.Helper()
	dir, _ = filepath.Abs("testdata/sdk")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "openai"))
	}
	if err != nil {
		if os.Getenv("ROLTER_REQUIRE_SDK") != "" {
			t.Fatalf("the OpenAI Node SDK is required (run `make deps`): %s", err)
		}
		t.Skipf("OpenAI Node SDK not installed (run `make deps`): %s", err)
	}
	return node, dir
}

// openAIUpstream answers like vLLM: chat completions (JSON or SSE with include_usage) and, for the model
// "dying", a stream that breaks after its first chunk.
func openAIUpstream(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model         string `json:"model"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.NewDecoder(r.Body).Decode(&req)
	created := time.Now().Unix()
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"Hello there"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}}`, created, req.Model)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	chunk := func(delta, usage string) {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":%d,\"model\":%q,\"choices\":[%s]%s}\n\n", created, req.Model, delta, usage)
		fl.Flush()
	}
	chunk(`{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}`, "")
	chunk(`{"index":0,"delta":{"content":"Hello"},"finish_reason":null}`, "")
	if req.Model == "dying" {
		time.Sleep(10 * time.Millisecond)
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
		return
	}
	chunk(`{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}`, "")
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":%d,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n", created, req.Model)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}
