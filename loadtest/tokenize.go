package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// tokenizer asks an engine's /tokenize for the token ids of chat prompts and caches them per
// prompt, as a client of a vLLM fleet that feeds precise_cache_aware would. It is safe for
// concurrent use.
type tokenizer struct {
	url    string
	model  string
	client *http.Client

	mu    sync.Mutex
	cache map[string]string // tokenize body -> "1,2,3"
}

func newTokenizer(baseURL, model string, client *http.Client) *tokenizer {
	return &tokenizer{
		url:    strings.TrimRight(baseURL, "/") + "/tokenize",
		model:  model,
		client: client,
		cache:  map[string]string{},
	}
}

type tokenizeRequest struct {
	Model               string    `json:"model"`
	Messages            []Message `json:"messages"`
	AddGenerationPrompt bool      `json:"add_generation_prompt"`
}

// header returns the x-rolter-vllm-token-ids value for msgs.
func (t *tokenizer) header(ctx context.Context, msgs []Message) (string, error) {
	body, err := json.Marshal(tokenizeRequest{Model: t.model, Messages: msgs, AddGenerationPrompt: true})
	if err != nil {
		return "", fmt.Errorf("cannot encode tokenize request: %w", err)
	}
	key := string(body)
	t.mu.Lock()
	h, ok := t.cache[key]
	t.mu.Unlock()
	if ok {
		return h, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("cannot build tokenize request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("cannot tokenize at %s: %w", t.url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return "", fmt.Errorf("cannot read tokenize response from %s: %w", t.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("cannot tokenize at %s: status %d: %s", t.url, resp.StatusCode, errorMessage(data))
	}
	var out struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return "", fmt.Errorf("cannot decode tokenize response from %s: %w", t.url, err)
	}
	h = FormatTokenIDs(out.Tokens)
	t.mu.Lock()
	t.cache[key] = h
	t.mu.Unlock()
	return h, nil
}
