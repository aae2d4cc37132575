package webtest

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/engine"
)

// TestDashboardDisaggregation: the Fleet page shows a disaggregated route's protocol, threshold and hops,
// and its prefill and decode pools as two labelled tables, each target with its own requests and
// eligibility, and a legend entry for each; a route that is not disaggregated keeps its one table. The
// state answer fits openapi.json.
func TestDashboardDisaggregation(t *testing.T) {
	pre, dec0, dec1 := newEngineStub(t), newEngineStub(t), newEngineStub(t)
	file := parseFile(t, fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[providers]]
name = "pre"
api_base = %q
[[providers]]
name = "dec0"
api_base = %q
[[providers]]
name = "dec1"
api_base = %q
[[routes]]
model = "chat"
strategy = "cache_aware"
[[routes.targets]]
provider = "pre"
[routes.disaggregation]
prefill_threshold_tokens = 16
[[routes.disaggregation.decode]]
provider = "dec0"
[[routes.disaggregation.decode]]
provider = "dec1"
[[routes]]
model = "whole"
[[routes.targets]]
provider = "pre"
`, pre.URL, dec0.URL, dec1.URL))
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

	// Three prompts over the threshold: each is prefilled on pre and generated on a decode engine.
	for i := range 3 {
		body := fmt.Sprintf(`{"model":"chat","messages":[{"role":"user","content":"question %d: %s"}]}`, i, strings.Repeat("about the two pools of the fleet ", 8))
		resp, err := http.Post(gwURL+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Target") != "pre" {
			t.Fatalf("request %d: %d, prefill target %q: %s", i, resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Target"), out)
		}
	}
	var state engine.State
	r := api.do("GET", "/api/v1/state", "", nil)
	want(t, r, 200, "")
	r.json(t, &state)
	if pd := state.Routes[0].Disaggregation; pd == nil || pd.Hops.PrefillOK != 3 || pd.Decode[0].Requests+pd.Decode[1].Requests != 3 {
		t.Fatalf("state %+v", state.Routes[0])
	}

	p := newTab(t, hs.URL)
	p.do("open Fleet", chromedp.Navigate(hs.URL+"/dashboard/#/fleet"))
	route := `document.querySelector('section[data-route="chat"]')`
	row := func(pool, provider string) string {
		return route + `.querySelector('table[data-pool="` + pool + `"] tr[data-pool="` + pool + `"][data-provider="` + provider + `"]')`
	}
	p.wait("the two pools", row("prefill", "pre")+` && `+row("decode", "dec0")+` && `+row("decode", "dec1")+` && `+
		`!`+row("prefill", "dec0")+` && !`+row("decode", "pre")+` && `+
		route+`.querySelector('table[data-pool="prefill"] caption').textContent.startsWith("Prefill pool") && `+
		route+`.querySelector('table[data-pool="decode"] caption').textContent.startsWith("Decode pool") && `+
		row("prefill", "pre")+`.querySelector('[data-col="requests"]').textContent === "3" && `+
		`Number(`+row("decode", "dec0")+`.querySelector('[data-col="requests"]').textContent) + Number(`+row("decode", "dec1")+`.querySelector('[data-col="requests"]').textContent) === 3`)
	p.wait("the protocol, threshold and hops", route+`.querySelector("h2").textContent.includes("disaggregated (vllm)") && `+
		route+`.querySelector('[data-col="disaggregation"]').textContent.includes("under 16 tokens skip the prefill pool") && `+
		route+`.querySelector('[data-col="hops"]').textContent.startsWith("Hops: prefill 3 ok, 0 failed") && `+
		route+`.querySelector('[data-col="skipped"]').textContent.includes("KV params: absent 3")`)
	p.wait("the other route's one table", `document.querySelectorAll('section[data-route="whole"] table').length === 1 && `+
		`!document.querySelector('section[data-route="whole"] [data-pool], section[data-route="whole"] .disagg') && `+
		`!document.querySelector('section[data-route="whole"] h2').textContent.includes("disaggregated")`)
	p.wait("a legend entry per pool", `(() => {
		const items = [...document.querySelectorAll(".legend li")].map((li) => li.textContent);
		return ["chat: pre (prefill)", "chat: dec0 (decode)", "chat: dec1 (decode)", "whole: pre"].every((l) => items.includes(l));
	})()`)
	p.shot("fleet-disaggregation")

	p.wait("the decode pool eligible", row("decode", "dec0")+`.querySelector('[data-col="eligible"]').textContent === "yes"`)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.problems {
		t.Errorf("the page: %s", m)
	}
}
