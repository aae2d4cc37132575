package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testConfig is a fast engine on a free loopback port.
func testConfig() Config {
	return Config{
		Host:      "127.0.0.1",
		MaxTokens: 4,
	}
}

func startEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %s", err)
	}
	if err := e.Start(); err != nil {
		t.Fatalf("Start: %s", err)
	}
	t.Cleanup(e.Stop)
	return e
}

// client is an HTTP client whose idle connections a test can close.
type client struct {
	t  *testing.T
	tr *http.Transport
	c  *http.Client
}

func newClient(t *testing.T, timeout time.Duration) *client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &client{t: t, tr: tr, c: &http.Client{Transport: tr, Timeout: timeout}}
}

type completion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    int    `json:"code"`
	} `json:"error"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// post sends body and returns the status, the headers and the raw body.
func (c *client) post(url, body string, header ...string) (int, http.Header, []byte, error) {
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		c.t.Fatalf("cannot build request: %s", err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.c.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// completion posts body and decodes the JSON answer, failing the test on transport errors.
func (c *client) completion(url, body string) (int, completion) {
	c.t.Helper()
	status, _, b, err := c.post(url, body)
	if err != nil {
		c.t.Fatalf("POST %s: %s", url, err)
	}
	var out completion
	if err := json.Unmarshal(b, &out); err != nil {
		c.t.Fatalf("cannot decode %q: %s", b, err)
	}
	return status, out
}

func (c *client) get(url string) (int, []byte) {
	c.t.Helper()
	resp, err := c.c.Get(url)
	if err != nil {
		c.t.Fatalf("GET %s: %s", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("GET %s: %s", url, err)
	}
	return resp.StatusCode, b
}

// sseEvent is one "data:" payload of a stream.
type sseStream struct {
	events []string
	done   bool  // saw data: [DONE]
	err    error // read error (e.g. unexpected EOF)
	first  time.Duration
}

// stream posts body and reads SSE events until the body ends.
func (c *client) stream(url, body string) (int, sseStream) {
	c.t.Helper()
	start := time.Now()
	resp, err := c.c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		c.t.Fatalf("POST %s: %s", url, err)
	}
	defer resp.Body.Close()
	var s sseStream
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			c.t.Fatalf("line %q is not an SSE data line", line)
		}
		if len(s.events) == 0 && !s.done {
			s.first = time.Since(start)
		}
		if data == "[DONE]" {
			s.done = true
			continue
		}
		if s.done {
			c.t.Fatalf("event %q after [DONE]", data)
		}
		s.events = append(s.events, data)
	}
	s.err = sc.Err()
	return resp.StatusCode, s
}

var metricLine = regexp.MustCompile(`(?m)^([a-z_:]+)\{[^}]*\} (\S+)$`)

// metrics scrapes /metrics into name -> value.
func (c *client) metrics(base string) map[string]float64 {
	c.t.Helper()
	status, b := c.get(base + "/metrics")
	if status != 200 {
		c.t.Fatalf("/metrics status %d", status)
	}
	m := make(map[string]float64)
	for _, sub := range metricLine.FindAllSubmatch(b, -1) {
		v, err := strconv.ParseFloat(string(sub[2]), 64)
		if err != nil {
			c.t.Fatalf("metric %s has value %q", sub[1], sub[2])
		}
		m[string(sub[1])] = v
	}
	return m
}

// eventually retries cond until it holds or 5 seconds pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// words returns a deterministic English-like text of n words starting with seed.
func words(seed string, n int) string {
	var b bytes.Buffer
	b.WriteString(seed)
	vocab := []string{"the", "cache", "aware", "router", "sends", "each", "request", "to", "a", "replica",
		"that", "already", "holds", "its", "prefix", "in", "memory", "and", "keeps", "load", "balanced"}
	x := uint32(len(seed)*7919 + 1)
	for _, c := range seed {
		x = x*31 + uint32(c)
	}
	for i := 0; i < n; i++ {
		x = x*1664525 + 1013904223
		fmt.Fprintf(&b, " %s", vocab[(x>>16)%uint32(len(vocab))])
	}
	return b.String()
}

func chatBody(content string, extra string) string {
	c, _ := json.Marshal(content)
	return `{"model":"sim-model","messages":[{"role":"user","content":` + string(c) + `}]` + extra + `}`
}
