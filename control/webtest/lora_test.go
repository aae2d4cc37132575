package webtest

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/engine"
)

// loraEngine is a fake vLLM serving LoRA adapters of base model "up-base": /v1/models lists the base model
// and every adapter of adapters (a card with a parent); /metrics reports the adapters it has served as
// running in vllm:lora_requests_info, with two slots; completions are answered at once.
type loraEngine struct {
	URL string

	mu     sync.Mutex
	served []string // the adapters of the completions answered, sorted
}

func newLoRAEngine(t *testing.T, adapters []string) *loraEngine {
	t.Helper()
	e := &loraEngine{}
	models := []map[string]any{{"id": "up-base", "object": "model", "parent": nil}}
	for _, a := range adapters {
		models = append(models, map[string]any{"id": a, "object": "model", "parent": "up-base", "root": "/adapters/" + a})
	}
	list, err := json.Marshal(map[string]any{"object": "list", "data": models})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(list)
			return
		case "/metrics":
			e.mu.Lock()
			running := strings.Join(e.served, ",")
			e.mu.Unlock()
			fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"up-base\"} 0\n"+
				"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"up-base\"} 0\n"+
				"# TYPE vllm:lora_requests_info gauge\n"+
				"vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} %d\n",
				running, time.Now().Unix())
			return
		}
		var req struct {
			Model string `json:"model"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		e.mu.Lock()
		if !slices.Contains(e.served, req.Model) {
			e.served = append(e.served, req.Model)
			slices.Sort(e.served)
		}
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"chat.completion","model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1,"total_tokens":11}}`, req.Model)
	}))
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return e
}

// TestDashboardLoRA: the Fleet page shows a base route's adapters below it, one row per adapter route
// (no section of their own, no series in the chart): its home set's width and bounds, the home set, the
// holders (the replica its request went to, marked running once the engine says so) and its requests;
// each replica's row shows what its engine reports of its adapters. The adapters' fold holds across polls,
// and the state answer fits openapi.json.
func TestDashboardLoRA(t *testing.T) {
	adapters := []string{"sql", "chat", "legal"}
	var engines []*loraEngine
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n[metrics_scrape]\nenabled = true\n")
	for i := range 3 {
		engines = append(engines, newLoRAEngine(t, adapters))
		fmt.Fprintf(&b, "[[providers]]\nname = \"e%d\"\napi_base = %q\n", i, engines[i].URL)
	}
	b.WriteString("[[routes]]\nmodel = \"llama\"\nstrategy = \"cache_aware\"\n")
	for i := range engines {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"e%d\"\nmodel = \"up-base\"\n", i)
	}
	b.WriteString("[routes.lora]\nadapters = [\"sql\", \"chat\", \"legal\"]\nmax_home_replicas = 2\n")
	file := parseFile(t, b.String())
	gw, err := engine.New(file, engine.Options{Logger: slog.New(slog.DiscardHandler), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	gwURL := serveGateway(t, gw)
	st, err := store.Open(filepath.Join(t.TempDir(), "rolter.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := control.NewServer(control.Options{Store: st, File: func() *config.Config { return file }, Apply: gw.Reload,
		State: gw.State, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	api := &apiClient{t: t, base: hs.URL}

	// One request for sql, two for chat: each goes to a replica of the adapter's home set, which then
	// holds it; legal has no requests and no holder.
	sent := map[string][]string{}
	for _, model := range []string{"sql", "chat", "chat"} {
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"a question for %s"}]}`, model, model)
		resp, err := http.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		p := resp.Header.Get("X-Rolter-Provider")
		if resp.StatusCode != 200 || p == "" {
			t.Fatalf("%s: %d, provider %q: %s", model, resp.StatusCode, p, out)
		}
		sent[model] = append(sent[model], p)
	}

	p := newTab(t, hs.URL)
	p.do("open Fleet", chromedp.Navigate(hs.URL+"/dashboard/#/fleet"))
	base := `document.querySelector('section[data-route="llama"]')`
	fold := base + `.querySelector('details.lora[data-lora-base="llama"]')`
	row := func(adapter string) string {
		return fold + `.querySelector('tr[data-route="` + adapter + `"][data-lora-base="llama"]')`
	}
	cell := func(adapter, col string) string {
		return row(adapter) + `.querySelector('[data-col="` + col + `"]').textContent`
	}
	p.wait("the adapters below their base route", row("sql")+` && `+row("chat")+` && `+row("legal")+` && `+fold+`.open && `+
		fold+`.querySelector("summary").textContent.startsWith("3 LoRA adapters of llama: 2 held by a replica, 0 in flight · dynamic loading off") && `+
		base+`.querySelector("h2").textContent.includes("3 LoRA adapters") && `+
		`!document.querySelector('section[data-route="sql"], section[data-route="chat"], section[data-route="legal"]')`)
	p.wait("each adapter's width, holders and requests", cell("sql", "k")+` === "1 (1–2)" && `+cell("legal", "k")+` === "1 (1–2)" && `+
		cell("sql", "holders")+`.startsWith("`+sent["sql"][0]+`") && `+cell("legal", "holders")+` === "none" && `+
		cell("sql", "requests")+` === "1 · `+sent["sql"][0]+` 1" && parseInt(`+cell("chat", "requests")+`, 10) === 2 && `+
		cell("legal", "requests")+` === "0" && `+cell("sql", "inflight")+` === "0" && `+cell("sql", "loads")+` === "off"`)
	// Once its engine's scrape reports it, the adapter's holder is marked running, and every replica's row
	// shows its engine's adapters.
	holder := sent["sql"][0]
	p.wait("the engines' adapters", cell("sql", "holders")+` === "`+holder+` (running)" && `+
		base+`.querySelector('tr[data-provider="`+holder+`"] [data-col="adapters"]').textContent.includes("running `+strings.Join(served(sent, holder), ", ")+` · waiting none · 2 slots · 3 registered") && `+
		`[...`+base+`.querySelectorAll('tbody tr[data-provider] [data-col="adapters"]')].length === 3 && `+
		`[...`+base+`.querySelectorAll('tbody tr[data-provider] [data-col="adapters"]')].every((td) => td.textContent.endsWith("· 2 slots · 3 registered"))`)
	p.wait("each replica's requests, its adapters' included", `(() => {
		const cells = [...`+base+`.querySelectorAll('tbody tr[data-provider] [data-col="requests"]')];
		return cells.length === 3 && cells.reduce((s, td) => s + parseInt(td.textContent, 10), 0) === 3 &&
			`+base+`.querySelector('tr[data-provider="`+holder+`"] [data-col="requests"]').textContent.includes(" of adapters");
	})()`)
	p.wait("no adapter in the chart", `(() => {
		const items = [...document.querySelectorAll(".legend li")].map((li) => li.textContent);
		return items.length === 3 && ["llama: e0", "llama: e1", "llama: e2"].every((l) => items.includes(l));
	})()`)
	p.shot("fleet-lora")

	// The page's home sets and holders are the state's; the answer fits openapi.json (apiClient.do).
	var state engine.State
	r := api.do("GET", "/api/v1/state", "", nil)
	want(t, r, 200, "")
	r.json(t, &state)
	for _, rs := range state.Routes {
		if rs.LoRA == nil {
			continue
		}
		l := rs.LoRA
		if l.Base != "llama" || l.Adapter != rs.Model || l.K != 1 || l.KMin != 1 || l.KMax != 2 || len(l.Order) != 3 || len(l.Home) != 1 {
			t.Fatalf("adapter route %s: %+v", rs.Model, l)
		}
		if want := slices.Compact(slices.Sorted(slices.Values(sent[rs.Model]))); !slices.Equal(slices.Sorted(slices.Values(l.Holders)), want) {
			t.Fatalf("adapter route %s: holders %v, its requests went to %v", rs.Model, l.Holders, want)
		}
		p.wait(rs.Model+"'s home set", cell(rs.Model, "home")+` === "`+strings.Join(l.Home, ", ")+`"`)
	}
	for _, ts := range state.Routes[0].Targets {
		if a := ts.Adapters; a == nil || len(a.Registered) != 3 || a.MaxLoRA == nil || *a.MaxLoRA != 2 {
			t.Fatalf("target %s: adapters %+v", ts.Provider, a)
		}
	}

	// Folded by the user, the adapters stay folded through the next poll.
	p.do("fold the adapters", chromedp.Click(chromedp.CSS(`section[data-route="llama"] details.lora summary`)))
	status := eval[string](p, `document.getElementById("fleet-status").textContent`)
	p.wait("the next poll", `document.getElementById("fleet-status").textContent !== `+strconv.Quote(status)+` && `+row("sql"))
	p.wait("the fold kept", `!`+fold+`.open`)

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.problems {
		t.Errorf("the page: %s", m)
	}
}

// served returns the adapters sent to provider, sorted, as its engine reports them running.
func served(sent map[string][]string, provider string) []string {
	var out []string
	for model, ps := range sent {
		if slices.Contains(ps, provider) {
			out = append(out, model)
		}
	}
	slices.Sort(out)
	return out
}
