package webtest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// engineStub is a fake engine on loopback for the browser test: completions answered at once, or held
// until released; /metrics in vLLM's format with the requests it holds as running.
type engineStub struct {
	URL  string
	held atomic.Int64
	gate atomic.Pointer[chan struct{}] // non-nil: completions wait until it is closed
}

func newEngineStub(t *testing.T) *engineStub {
	t.Helper()
	u := &engineStub{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"chat\"} %d\n"+
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"chat\"} 0\n", u.held.Load())
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		if g := u.gate.Load(); g != nil {
			u.held.Add(1)
			select {
			case <-*g:
			case <-r.Context().Done():
			}
			u.held.Add(-1)
		}
		w.Header().Set("Content-Type", "application/json")
		// 30 of 50 prompt tokens from the engine's cache: the Fleet page shows 60.0% delivered.
		fmt.Fprint(w, `{"id":"cmpl-1","object":"chat.completion","model":"chat","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":50,"completion_tokens":1,"total_tokens":51,"prompt_tokens_details":{"cached_tokens":30}}}`)
	}))
	t.Cleanup(func() {
		u.release() // a held request would keep Close waiting
		srv.Close()
	})
	u.URL = srv.URL
	return u
}

func (u *engineStub) hold() {
	g := make(chan struct{})
	u.gate.Store(&g)
}

func (u *engineStub) release() {
	if g := u.gate.Swap(nil); g != nil {
		close(*g)
	}
}
