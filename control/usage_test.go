package control

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/control/store/pgtest"
	"github.com/rolter-ai/rolter/sim"
)

// usageOf is GET path's rows, checked as the API's answer.
func (e *env) usageOf(path, token string) usageAnswer {
	e.t.Helper()
	r := e.api.do("GET", path, token, nil)
	want(e.t, r, 200, "")
	var u usageAnswer
	r.json(e.t, &u)
	return u
}

// startSims starts n simulated vLLM engines and returns them.
func startSims(t *testing.T, n int) []*sim.Engine {
	t.Helper()
	var out []*sim.Engine
	for i := range n {
		c := sim.DefaultConfig()
		c.EngineLabel = fmt.Sprint(i)
		s, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		out = append(out, s)
	}
	return out
}

// answerUsage is the usage an answer reported to its client.
type answerUsage struct {
	PromptTokens        int64 `json:"prompt_tokens"`
	CompletionTokens    int64 `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// sendChat sends a chat completion of model with key to the gateway, streamed (with include_usage) or
// not, and returns the status and the usage the answer carried.
func (e *env) sendChat(model, key, text string, maxTokens int, stream bool) (int, answerUsage) {
	e.t.Helper()
	body := map[string]any{"model": model, "max_tokens": maxTokens, "messages": []map[string]string{{"role": "user", "content": text}}}
	if stream {
		body["stream"] = true
		body["stream_options"] = map[string]bool{"include_usage": true}
	}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var u struct {
		Usage *answerUsage `json:"usage"`
	}
	if resp.StatusCode != 200 {
		return resp.StatusCode, answerUsage{}
	}
	if !stream {
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil || u.Usage == nil {
			e.t.Fatalf("an answer without usage: %v", err)
		}
		return 200, *u.Usage
	}
	var last *answerUsage
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		u.Usage = nil
		if json.Unmarshal([]byte(data), &u) == nil && u.Usage != nil {
			last = u.Usage
		}
	}
	if last == nil {
		e.t.Fatal("a stream without a usage chunk")
	}
	return 200, *last
}

// TestUsageEndToEnd: a gateway of the control plane in front of two simulated vLLM engines; two keys of an
// org send streamed (include_usage) and whole chat completions; the org's usage by key has what the
// engines counted (requests, prompt and completion tokens) and what the answers reported, and the request
// a key's rpm limit refused counts as refused, not as a request. Storing usage leaves the generation.
func TestUsageEndToEnd(t *testing.T) {
	sims := startSims(t, 2)
	e := newEnv(t, "")
	a := e.mkOrg("a")
	base := "/api/v1/orgs/" + a
	want(t, e.su("POST", base+"/providers", provider("s1", sims[0].URL())), 201, "")
	want(t, e.su("POST", base+"/providers", provider("s2", sims[1].URL())), 201, "")
	want(t, e.su("POST", base+"/routes", map[string]any{"model": "m", "strategy": "round_robin",
		"targets": []map[string]any{{"provider": "s1", "model": "sim-model"}, {"provider": "s2", "model": "sim-model"}}}), 201, "")
	r := e.su("POST", base+"/keys", map[string]any{"name": "limited", "limits": map[string]any{"rpm": 3}})
	want(t, r, 201, "")
	var k1 struct{ ID, Secret string }
	r.json(t, &k1)
	tok, _ := e.mkToken(a)
	k2, k2ID := e.mkKey(a, tok)

	type sums struct{ requests, refused, prompt, cached, completion int64 }
	sent := map[string]*sums{k1.ID: {}, k2ID: {}}
	send := func(key, id string, i int) {
		status, u := e.sendChat("m", key, strings.Repeat("tell me about usage ", 1+i%5)+fmt.Sprint(i), 3+i%7, i%2 == 0)
		s := sent[id]
		switch status {
		case 200:
			s.requests++
			s.prompt += u.PromptTokens
			s.cached += u.PromptTokensDetails.CachedTokens
			s.completion += u.CompletionTokens
		case 429:
			s.refused++
		default:
			t.Fatalf("status %d", status)
		}
	}
	gen := e.usageGeneration()
	for i := range 4 { // the 4th is over the rpm limit
		send(k1.Secret, k1.ID, i)
	}
	for i := range 9 {
		send(k2, k2ID, i)
	}
	if *sent[k1.ID] == (sums{}) || sent[k1.ID].requests != 3 || sent[k1.ID].refused != 1 || sent[k2ID].requests != 9 {
		t.Fatalf("sent %+v %+v", *sent[k1.ID], *sent[k2ID])
	}

	u := e.usageOf(base+"/usage?group_by=key", tok)
	if len(u.Data) != 2 || strings.Join(u.GroupBy, ",") != "key" {
		t.Fatalf("usage by key: %+v", u)
	}
	var total sums
	for _, row := range u.Data {
		s := sent[row.Key]
		if row.Org != a || row.Start != "" || row.Model != "" || s == nil {
			t.Fatalf("row %+v", row)
		}
		got := sums{row.Requests, row.Refused, row.PromptTokens, row.CachedTokens, row.CompletionTokens}
		if got != *s {
			t.Errorf("key %s: stored %+v, the answers had %+v", row.Key, got, *s)
		}
		total.requests += row.Requests
		total.prompt += row.PromptTokens
		total.completion += row.CompletionTokens
	}
	var simRequests, simPrompt uint64
	for _, s := range sims {
		st := s.Stats()
		simRequests += st.Requests
		simPrompt += st.QueriedTokens
	}
	if uint64(total.requests) != simRequests || uint64(total.prompt) != simPrompt {
		t.Errorf("stored %d requests and %d prompt tokens; the engines counted %d and %d", total.requests, total.prompt, simRequests, simPrompt)
	}
	if want := sent[k1.ID].completion + sent[k2ID].completion; total.completion != want || want == 0 {
		t.Errorf("stored %d completion tokens, the answers had %d", total.completion, want)
	}

	// By hour, by key and model, and every org's: the same sums, in other rows.
	// An hour (or a day) may have begun during the test: the rows of each are summed.
	byHour := e.usageOf(base+"/usage", tok)
	var hourly sums
	for _, row := range byHour.Data {
		if row.Start == "" || row.Key != "" || row.Model != "" {
			t.Fatalf("usage by hour: %+v", byHour)
		}
		hourly.requests += row.Requests
		hourly.refused += row.Refused
	}
	if len(byHour.Data) == 0 || len(byHour.Data) > 2 || hourly.requests != total.requests || hourly.refused != 1 {
		t.Fatalf("usage by hour: %+v", byHour)
	}
	km := e.usageOf(base+"/usage?group_by=key,model", tok)
	if len(km.Data) != 2 || km.Data[0].Model != "m" || km.Data[0].Key == "" {
		t.Fatalf("usage by key and model: %+v", km)
	}
	all := e.usageOf("/api/v1/usage?group_by=day,model", rootToken)
	var daily int64
	for _, row := range all.Data {
		if row.Org != a || row.Model != "m" || !strings.HasSuffix(row.Start, "T00:00:00Z") {
			t.Fatalf("every org's usage by day and model: %+v", all)
		}
		daily += row.Requests
	}
	if len(all.Data) == 0 || daily != total.requests {
		t.Fatalf("every org's usage by day and model: %+v", all)
	}
	// Read again: the flush before each read stored nothing twice.
	if again := e.usageOf(base+"/usage?group_by=key", tok); fmt.Sprint(again.Data) != fmt.Sprint(u.Data) {
		t.Fatalf("read again: %+v, first %+v", again.Data, u.Data)
	}
	if g := e.usageGeneration(); g != gen {
		t.Fatalf("generation %d after usage was stored, want %d", g, gen)
	}
}

// usageGeneration is the store's generation.
func (e *env) usageGeneration() int64 {
	e.t.Helper()
	g, err := e.store.Generation(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return g
}

// TestUsageFlushRetries: usage a flush could not store is kept and stored by the next one, once; the
// flusher's Stop stores what is left.
func TestUsageFlushRetries(t *testing.T) {
	e := newEnv(t, "")
	a := e.mkOrg("a")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", e.A.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+a+"/routes", route("ma", "p")), 201, "")
	key := e.orgKey(a)
	e.wantChat("ma", key, 200, "")

	raw, err := sql.Open("sqlite", e.path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec("ALTER TABLE usage RENAME TO usage_away"); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.FlushUsage(context.Background()); err == nil || !strings.Contains(err.Error(), "kept for the next flush") {
		t.Fatalf("flush without its table: %v", err)
	}
	e.wantChat("ma", key, 200, "")
	if _, err := raw.Exec("ALTER TABLE usage_away RENAME TO usage"); err != nil {
		t.Fatal(err)
	}
	f := NewUsageFlusher(e.srv, time.Hour, nil)
	f.Start()
	e.wantChat("ma", key, 200, "")
	f.Stop()
	rows, err := e.store.Usage(context.Background(), a, time.Now().Add(-2*time.Hour), time.Now().Add(time.Hour))
	if err != nil || len(rows) != 1 || rows[0].Requests != 3 {
		t.Fatalf("stored %+v, %v; want 3 requests", rows, err)
	}
}

// TestUsageAPI: who may read usage, and every bad parameter answered 400 in the API's error shape.
func TestUsageAPI(t *testing.T) {
	e := newEnv(t, "")
	a, b := e.mkOrg("a"), e.mkOrg("b")
	tok, _ := e.mkToken(a)
	u := e.usageOf("/api/v1/orgs/"+a+"/usage", tok)
	from, _ := time.Parse(time.RFC3339, u.From)
	to, _ := time.Parse(time.RFC3339, u.To)
	if to.Sub(from) != 24*time.Hour || strings.Join(u.GroupBy, ",") != "hour" || u.Data == nil || len(u.Data) != 0 {
		t.Fatalf("default usage: %+v", u)
	}
	since := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second).Format(time.RFC3339)
	if u := e.usageOf("/api/v1/orgs/"+a+"/usage?from="+since, tok); u.From != since {
		t.Fatalf("from: %+v", u)
	}
	e.usageOf("/api/v1/orgs/"+fileOrg+"/usage", rootToken)
	want(t, e.api.do("GET", "/api/v1/orgs/"+b+"/usage", tok, nil), 404, "not_found")
	want(t, e.api.do("GET", "/api/v1/orgs/org_none/usage", rootToken, nil), 404, "not_found")
	want(t, e.api.do("GET", "/api/v1/usage", tok, nil), 403, "forbidden")
	want(t, e.api.do("GET", "/api/v1/usage", "", nil), 401, "unauthorized")
	for q, msg := range map[string]string{
		"from=yesterday": `cannot use from "yesterday": want an RFC 3339 time`,
		"to=2026-03-01":  `cannot use to "2026-03-01"`,
		"from=2026-03-02T00:00:00Z&to=2026-03-01T00:00:00Z": "from 2026-03-02T00:00:00Z is after to 2026-03-01T00:00:00Z",
		"from=2026-01-01T00:00:00Z&to=2026-04-04T00:00:01Z": "is longer than 93 days",
		"group_by=week":       `cannot group usage by "week": want one or more of hour, day, key, model`,
		"group_by=key,,model": `cannot group usage by ""`,
		"group_by=hour,day":   "has both hour and day",
		"group_by=key,key":    "names key twice",
	} {
		want(t, e.api.do("GET", "/api/v1/orgs/"+a+"/usage?"+q, tok, nil), 400, "invalid_request", msg)
		want(t, e.api.do("GET", "/api/v1/usage?"+q, rootToken, nil), 400, "invalid_request", msg)
	}
	e.usageOf("/api/v1/usage?from=2026-01-01T00:00:00Z&to=2026-04-04T00:00:00Z&group_by=day,key,model", rootToken)
}

// TestFleetUsageAddsUp: two gateways on one PostgreSQL store each flush what their keys used; the store
// has the sum, read through either.
func TestFleetUsageAddsUp(t *testing.T) {
	dsn := pgtest.Database(t)
	g1, g2 := newEnvAt(t, dsn), newEnvAt(t, dsn)
	a := g1.mkOrg("a")
	want(t, g1.su("POST", "/api/v1/orgs/"+a+"/providers", provider("p", g1.A.URL)), 201, "")
	want(t, g1.su("POST", "/api/v1/orgs/"+a+"/routes", route("ma", "p")), 201, "")
	key := g1.orgKey(a)
	if _, err := g2.srv.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		g1.wantChat("ma", key, 200, "")
	}
	for range 2 {
		g2.wantChat("ma", key, 200, "")
	}
	if err := g2.srv.FlushUsage(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*env{g1, g2} {
		u := g.usageOf("/api/v1/usage?group_by=key", rootToken)
		if len(u.Data) != 1 || u.Data[0].Requests != 5 {
			t.Fatalf("fleet usage: %+v", u.Data)
		}
	}
}
