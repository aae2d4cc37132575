package webtest

import (
	"net/http"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// TestDashboardUsage: an org's key sends three requests (50 prompt tokens, 30 of them cached, and one
// completion token each); the Usage page charts them per hour and lists them per key and model, for the
// superadmin across orgs and for the org alone.
func TestDashboardUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	e := newEnv(t)
	stub := newEngineStub(t)
	r := e.su("POST", "/api/v1/orgs", map[string]string{"name": "acme"})
	want(t, r, 201, "")
	var org orgView
	r.json(t, &org)
	want(t, e.su("POST", "/api/v1/orgs/"+org.ID+"/providers", provider("p", stub.URL)), 201, "")
	want(t, e.su("POST", "/api/v1/orgs/"+org.ID+"/routes", map[string]any{"model": "m", "targets": []map[string]any{{"provider": "p", "model": "chat"}}}), 201, "")
	r = e.su("POST", "/api/v1/orgs/"+org.ID+"/keys", map[string]string{"name": "app"})
	want(t, r, 201, "")
	var key struct{ ID, Secret string }
	r.json(t, &key)
	for range 3 {
		req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key.Secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}

	p := newTab(t, e.api.base)
	p.do("open the dashboard", chromedp.Navigate(p.origin+"/dashboard/#/usage"))
	p.do("sign in", chromedp.SendKeys(chromedp.ID("token"), rootToken), chromedp.KeyEvent(kb.Enter))
	p.wait("the Usage page in the nav", `document.querySelector('#nav a[data-page="usage"]')?.getAttribute("aria-current") === "page" && document.querySelector("main h1")?.textContent === "Usage"`)
	row := `[...document.querySelectorAll("main tbody tr")].map((tr) => [...tr.cells].map((td) => td.textContent).join("|"))`
	p.wait("every org's usage, per key and model", row+`.join("\n") === "acme|`+key.ID+`|m|3|0|150|90|3"`)
	p.wait("the chart's totals", `document.getElementById("usage-chart")?.dataset.totals === "150,90,3" && document.querySelectorAll("#usage-chart polyline").length === 3 && document.querySelectorAll(".legend li").length === 3`)
	p.shot("usage")

	p.do("only the org", chromedp.Click(chromedp.ID("usage-org-only")))
	p.wait("the org's usage, without an org column", row+`.join("\n") === "`+key.ID+`|m|3|0|150|90|3"`)
	eval[bool](p, `(() => { const s = document.getElementById("usage-range"); s.value = "168"; return s.dispatchEvent(new Event("change")); })()`)
	p.wait("the week's chart", `document.getElementById("usage-chart")?.getAttribute("aria-label").startsWith("Tokens per hour over the last 168 hours") && document.getElementById("usage-chart").dataset.totals === "150,90,3"`)

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.problems {
		t.Errorf("the page: %s", m)
	}
}
