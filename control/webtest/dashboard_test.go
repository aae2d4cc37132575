package webtest

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/kvindex"
)

// sum is a JavaScript function that adds up the leading integers of the Fleet cells of a column for the
// route "chat" ("3 running, 0 waiting" counts 3).
const sum = `((col) => [...document.querySelectorAll('tr[data-route="chat"] td[data-col="' + col + '"]')].reduce((s, td) => s + (parseInt(td.textContent, 10) || 0), 0))`

// wholeHeaders is true when the page has table headers and none breaks inside a word: a header's text
// takes no more lines than it has words.
const wholeHeaders = `(() => {
	const ths = [...document.querySelectorAll("main thead th")];
	return ths.length > 0 && ths.every((th) => {
		const r = document.createRange();
		r.selectNodeContents(th);
		const lines = new Set([...r.getClientRects()].map((c) => Math.round(c.top))).size;
		return lines <= th.textContent.trim().split(/\s+/).length;
	});
})()`

// TestDashboardBrowser drives the dashboard in headless Chromium against a real gateway and control plane
// on loopback: a wrong token refused, sign-in with the admin token (kept in sessionStorage, never in a URL
// or a log); an org made from the header; a provider with a KV events source made through the sheet and
// read back from the API, a blank number given its default, the source switched off and saved (gone from
// the API), a denied endpoint refused with the egress rule beside its field; a route with targets and
// weights, a field error beside its target, the caveat under precise_cache_aware and lmcache_aware, and
// the documentation link only once [docs] base_url is set; keys made (the secret shown once) and revoked; the Fleet page's
// numbers moving under a short load (in flight and the engine's queue while requests are held, then
// finished requests, their rate in the chart, the trie, the decisions and the delivered cache hits); a
// narrow window; the routes list and the audit log; an open control plane (no token) entered without the
// form; and the banner once the control plane is gone. The page must throw nothing, violate no CSP and
// fetch nothing from another origin. A screenshot of each page goes to $ROLTER_SCREENSHOTS.
func TestDashboardBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("the browser test is not short")
	}
	if !kvindex.Supported {
		t.Skip("KV events sources need cgo (libzmq): the provider sheet's KV source cannot be saved")
	}
	start := time.Now()
	u1, u2, shared := newEngineStub(t), newEngineStub(t), newEngineStub(t)
	e := newEnv(t)
	fileText := fileConfigText(shared.URL) + "[metrics_scrape]\nenabled = true\ninterval_secs = 0.2\n"
	e.file.Store(parseFile(t, fileText))
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	p := newTab(t, e.api.base)
	t.Logf("Chromium started in %s", time.Since(start).Round(time.Millisecond))

	// Sign in. The token goes to sessionStorage and the Authorization header only.
	p.do("open the dashboard", chromedp.Navigate(p.origin+"/dashboard/"))
	p.wait("the sign-in form, focused, with no error", `document.activeElement?.id === "token" && document.getElementById("login-error").hidden`)
	p.do("sign in with a wrong token", chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.KeyEvent(kb.Enter))
	p.wait("the refusal", `document.getElementById("login-error").textContent.includes("refused the token") && document.activeElement?.id === "token" && !sessionStorage.getItem("rolter.token")`)
	p.shot("login")
	p.do("sign in", chromedp.SendKeys(chromedp.ID("token"), rootToken), chromedp.KeyEvent(kb.Enter))
	p.wait("the Providers page", `!document.getElementById("app").hidden && document.querySelector("main h1")?.textContent === "Providers"`)
	if got := eval[[]any](p, `[location.href.includes(`+strconv.Quote(rootToken)+`), localStorage.length, document.cookie, sessionStorage.getItem("rolter.token") === `+strconv.Quote(rootToken)+`]`); got[0] != false || got[1] != 0.0 || got[2] != "" || got[3] != true {
		t.Fatalf("token in URL, localStorage length, cookies, token in sessionStorage: %v", got)
	}

	// An org, from the header: it becomes the one shown.
	p.do("make an org", chromedp.Click(chromedp.CSS("#new-org summary")), chromedp.SendKeys(chromedp.ID("new-org-name"), "acme"), chromedp.KeyEvent(kb.Enter))
	p.wait("the new org, writable", `document.getElementById("org").selectedOptions[0]?.textContent === "acme" && document.getElementById("new-provider")`)
	org := eval[string](p, `document.getElementById("org").value`)
	providerAPI := "/api/v1/orgs/" + org + "/providers/"
	readProvider := func() providerView {
		t.Helper()
		r := e.su("GET", providerAPI+"gpu-a", nil)
		want(t, r, 200, "")
		var v providerView
		r.json(t, &v)
		return v
	}

	// A provider with a KV events source, through the sheet; max_blocks left blank.
	ln, err := net.Listen("tcp", "127.0.0.1:0") // a port nobody listens on after Close: the source connects in vain
	if err != nil {
		t.Fatal(err)
	}
	kvEndpoint := "tcp://" + ln.Addr().String()
	ln.Close()
	p.do("open the new provider sheet", chromedp.Click(chromedp.ID("new-provider")))
	p.wait("the sheet, name focused", `document.activeElement?.id === "p-name" && document.getElementById("p-kv-fields").hidden`)
	p.do("fill the provider",
		chromedp.SendKeys(chromedp.ID("p-name"), "gpu-a"),
		chromedp.SendKeys(chromedp.ID("p-api_base"), u1.URL),
		chromedp.Focus(chromedp.ID("p-kv-switch")), chromedp.KeyEvent(" "), // the switch, by keyboard
	)
	p.wait("the KV events section", `!document.getElementById("p-kv-fields").hidden && document.getElementById("p-kv-switch").checked`)
	p.do("fill the KV events source",
		chromedp.SendKeys(chromedp.ID("p-kv_events-endpoint"), kvEndpoint),
		chromedp.SendKeys(chromedp.ID("p-kv_events-stale_secs"), "12"),
		chromedp.Click(chromedp.ID("p-save")),
	)
	p.wait("the provider saved", `document.getElementById("p-status").textContent.startsWith("Saved: version 1")`)
	got := readProvider()
	if kv := got.KVEvents; kv == nil || kv.Endpoint != kvEndpoint || kv.StaleSecs != 12 || kv.MaxBlocks != 1_000_000 || kv.Mode != "connect" || got.APIBase != u1.URL {
		t.Fatalf("the API has %+v with kv_events %+v; want the endpoint typed, stale_secs 12, and the defaults for the blanks", got, got.KVEvents)
	}
	if v := eval[string](p, `document.getElementById("p-kv_events-max_blocks").value`); v != "1000000" {
		t.Fatalf("the blank max_blocks shows %q after saving, want the default the API applied, 1000000", v)
	}
	p.shot("provider-sheet")

	// The switch off and saved: the source is removed.
	p.do("switch the KV source off and save", chromedp.Click(chromedp.ID("p-kv-switch")), chromedp.Click(chromedp.ID("p-save")))
	p.wait("the provider saved again", `document.getElementById("p-status").textContent.startsWith("Saved: version 2") && document.getElementById("p-kv-fields").hidden`)
	if got := readProvider(); got.KVEvents != nil || got.Version != 2 {
		t.Fatalf("after switching the source off and saving, the API has version %d with kv_events %+v", got.Version, got.KVEvents)
	}

	// A denied endpoint: the egress policy's refusal beside the field, and nothing saved.
	p.do("enter a link-local endpoint",
		chromedp.Click(chromedp.ID("p-kv-switch")),
		retype(chromedp.ID("p-kv_events-endpoint"), "tcp://169.254.169.254:5557"),
		chromedp.Click(chromedp.ID("p-save")),
	)
	p.wait("the egress error beside the endpoint", `(() => {
		const input = document.getElementById("p-kv_events-endpoint"), err = document.getElementById("p-kv_events-endpoint-error");
		return !err.hidden && err.textContent.includes("block_link_local") && input.getAttribute("aria-invalid") === "true" &&
			input.getAttribute("aria-describedby").split(" ").includes(err.id) && document.activeElement === input &&
			!document.getElementById("p-errors").hidden;
	})()`)
	if got := readProvider(); got.KVEvents != nil || got.Version != 2 {
		t.Fatalf("a refused save reached the API: version %d, kv_events %+v", got.Version, got.KVEvents)
	}
	p.shot("provider-sheet-error")

	// A second provider from the API; the list shows both.
	want(t, e.su("POST", "/api/v1/orgs/"+org+"/providers", provider("gpu-b", u2.URL)), 201, "")
	p.do("open the providers list", chromedp.Click(chromedp.CSS(`#nav a[data-page="providers"]`)))
	p.wait("both providers listed", `document.querySelector("main h1")?.textContent === "Providers" && document.querySelectorAll("main tbody tr").length === 2 && document.activeElement === document.querySelector("main h1")`)
	p.shot("providers")

	// A route through the sheet: two targets, a weight the API refuses beside its field, then accepted.
	p.do("open the new route sheet", chromedp.Click(chromedp.CSS(`#nav a[data-page="routes"]`)))
	p.wait("the routes page", `document.getElementById("new-route")`)
	p.do("open the route sheet", chromedp.Click(chromedp.ID("new-route")), chromedp.WaitVisible(chromedp.ID("r-model")))
	// A target picks its provider from the org's (and, for the superadmin, rolter.toml's shared ones).
	if got := eval[[]any](p, `[...document.querySelector('#r-targets [data-col="provider"]').options].map((o) => o.value)`); len(got) < 4 ||
		!slices.Contains(got, "gpu-a") || !slices.Contains(got, "gpu-b") || !slices.Contains(got, any("\u0000other")) {
		t.Fatalf("the target's provider picker offers %q; want gpu-a, gpu-b, the shared providers and other", got)
	}
	p.do("fill the route",
		chromedp.SendKeys(chromedp.ID("r-model"), "chat"),
		chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("r-strategy"); s.value = "cache_aware"; s.dispatchEvent(new Event("change")); })()`),
		chromedp.SetValue(chromedp.CSS(`#r-targets .target:nth-child(1) [data-col="provider"]`), "gpu-a"),
		chromedp.Click(chromedp.ID("r-add-target")),
		chromedp.SetValue(chromedp.CSS(`#r-targets .target:nth-child(2) [data-col="provider"]`), "gpu-b"),
		chromedp.SendKeys(chromedp.CSS(`#r-targets .target:nth-child(2) [data-col="weight"]`), "0"),
		chromedp.Click(chromedp.ID("r-save")),
	)
	p.wait("the weight's error beside it", `(() => {
		const w = document.querySelector('#r-targets .target:nth-child(2) [data-col="weight"]'), err = document.getElementById(w.dataset.error);
		return w.getAttribute("aria-invalid") === "true" && !err.hidden && err.textContent.includes("weight must be > 0");
	})()`)
	p.do("fix the weight and save",
		retype(chromedp.CSS(`#r-targets .target:nth-child(2) [data-col="weight"]`), "2"),
		chromedp.Click(chromedp.ID("r-save")),
	)
	p.wait("the route saved", `document.getElementById("r-status").textContent.startsWith("Saved: version 1")`)
	var rv routeView
	r := e.su("GET", "/api/v1/orgs/"+org+"/routes/chat", nil)
	want(t, r, 200, "")
	r.json(t, &rv)
	if rv.Strategy != "cache_aware" || len(rv.Targets) != 2 || rv.Targets[0].Provider != "gpu-a" || *rv.Targets[0].Weight != 1 ||
		rv.Targets[1].Provider != "gpu-b" || *rv.Targets[1].Weight != 2 || rv.Targets[1].Model != "chat" {
		t.Fatalf("the API has the route %+v", rv)
	}

	// The strategy picker: the caveat under the two strategies that read a source, and without [docs]
	// base_url the documentation links go to the control plane's own /docs/.
	const caveat = `(() => { const c = document.getElementById("strategy-caveat"); return !c.hidden && c.textContent === "A provider with no source routes by least load."; })()`
	const noCaveat = `document.getElementById("strategy-caveat").hidden`
	ownDocs := func(page string) string {
		return `!document.getElementById("strategy-docs").hidden && document.getElementById("strategy-docs-link")?.getAttribute("href") === "/docs/routing/` + page +
			`" && document.getElementById("docs-home")?.getAttribute("href") === "/docs/"`
	}
	pick := func(s string) chromedp.Action[chromedp.Void] {
		return chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("r-strategy"); s.value = ` + strconv.Quote(s) + `; s.dispatchEvent(new Event("change")); })()`)
	}
	p.wait("no caveat under cache_aware", noCaveat)
	p.do("pick precise_cache_aware", pick("precise_cache_aware"))
	p.wait("the caveat under precise_cache_aware, the link to its own docs page", caveat+" && "+ownDocs("precise-cache-aware"))
	p.do("the next strategy, by keyboard", chromedp.Focus(chromedp.ID("r-strategy")), chromedp.KeyEvent(kb.ArrowDown))
	p.wait("the caveat under lmcache_aware", `document.getElementById("r-strategy").value === "lmcache_aware" && `+caveat+" && "+ownDocs("lmcache-aware"))
	p.do("the next strategy, by keyboard", chromedp.KeyEvent(kb.ArrowDown))
	p.wait("no caveat under consistent_hash", `document.getElementById("r-strategy").value === "consistent_hash" && `+noCaveat)

	// With [docs] base_url, the link to the strategy's page.
	e.file.Store(parseFile(t, fileText+"[docs]\nbase_url = \"https://docs.rolter.test/v1\"\n"))
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	p.do("reload the page", chromedp.Reload())
	p.wait("the route sheet again, signed in from sessionStorage", `location.hash === "#/routes/edit/chat" && document.getElementById("r-strategy")?.value === "cache_aware" && document.getElementById("docs-home")`)
	p.do("pick precise_cache_aware", pick("precise_cache_aware"))
	p.wait("the caveat and the docs link", caveat+` && !document.getElementById("strategy-docs").hidden && document.getElementById("strategy-docs-link")?.getAttribute("href") === "https://docs.rolter.test/v1/routing/precise-cache-aware" && document.getElementById("docs-home")?.getAttribute("href") === "https://docs.rolter.test/v1/"`)
	p.shot("route-sheet")
	p.do("cache_aware again, unsaved", pick("cache_aware"))

	// Keys: made (the secret shown once), listed, one revoked by keyboard.
	p.do("open Keys", chromedp.Click(chromedp.CSS(`#nav a[data-page="keys"]`)))
	p.wait("the keys page", `document.getElementById("k-name") && document.querySelector("#keys-list .empty, #keys-list table")`)
	p.do("make the key old", chromedp.SendKeys(chromedp.ID("k-name"), "old"), chromedp.KeyEvent(kb.Enter))
	p.wait("its secret", `document.getElementById("key-secret-value")?.value.startsWith("rk-")`)
	p.do("make the key load", chromedp.SendKeys(chromedp.ID("k-name"), "load"), chromedp.KeyEvent(kb.Enter))
	p.wait("its secret", `document.querySelector("#key-secret strong")?.textContent.startsWith("Key load") && document.querySelectorAll("#keys-list tbody tr").length === 2`)
	key := eval[string](p, `document.getElementById("key-secret-value").value`)
	p.do("revoke old, by keyboard",
		chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll("#keys-list tbody tr")].find((r) => r.cells[0].textContent === "old").querySelector("button").focus()`),
		chromedp.KeyEvent(kb.Enter))
	p.wait("the confirmation, focused", `document.activeElement?.textContent === "Yes, revoke old"`)
	p.do("confirm", chromedp.KeyEvent(kb.Enter))
	p.wait("old revoked, load active", `(() => {
		const rows = [...document.querySelectorAll("#keys-list tbody tr")].map((r) => r.cells[0].textContent + ":" + r.cells[4].textContent);
		return rows.length === 2 && rows.some((r) => r.startsWith("old:revoked")) && rows.includes("load:active") && !document.getElementById("key-secret").textContent;
	})()`)
	var keys list[credentialView]
	e.su("GET", "/api/v1/orgs/"+org+"/keys", nil).json(t, &keys)
	revoked := map[string]bool{}
	for _, k := range keys.Data {
		revoked[k.Name] = k.Revoked != ""
	}
	if len(keys.Data) != 2 || !revoked["old"] || revoked["load"] {
		t.Fatalf("the API has the keys %+v", keys.Data)
	}
	p.shot("keys")

	// Fleet: in flight and the engine's queue while requests are held, then the finished requests, their
	// rate, the trie and the decisions under a short load.
	p.do("open Fleet", chromedp.Click(chromedp.CSS(`#nav a[data-page="fleet"]`)))
	p.wait("the live state", `document.getElementById("fleet-status").textContent.startsWith("Updated") && document.querySelectorAll('tr[data-route="chat"]').length === 2 && `+sum+`("requests") === 0`)
	var failures atomic.Int64
	var wg sync.WaitGroup
	send := func(n, from int) {
		for i := from; i < from+n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"model":"chat","messages":[{"role":"user","content":"question %d about the fleet's state"}]}`, i)
				req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("request %d: %s", i, err)
					failures.Add(1)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("request %d: status %d", i, resp.StatusCode)
					failures.Add(1)
				}
			}()
		}
	}
	u1.hold()
	u2.hold()
	send(6, 0)
	p.wait("6 requests in flight", sum+`("inflight") === 6 && `+sum+`("requests") === 0`)
	p.wait("the engines' queues", sum+`("engine") === 6`)
	u1.release()
	u2.release()
	wg.Wait()
	p.wait("6 requests finished", sum+`("inflight") === 0 && `+sum+`("requests") === 6`)
	// A few dozen more in three bursts, each one seen by the page before the next: the rate moves.
	for batch, done := 0, 6; batch < 3; batch++ {
		send(16, done)
		wg.Wait()
		if failures.Load() > 0 {
			t.FailNow()
		}
		done += 16
		p.wait(fmt.Sprintf("%d requests finished", done), sum+`("requests") === `+strconv.Itoa(done))
	}
	p.wait("54 requests, their rate in the chart, the tries, the decisions and the delivered cache hits", sum+`("requests") === 54 && `+
		`document.querySelector('.route-state[data-route="chat"] [data-col="hit-ratio"]').textContent.startsWith("Delivered cache hits: 60.0% of 2700 prompt tokens") && `+
		`Number(document.getElementById("fleet-chart").dataset.peak) > 0 && document.querySelectorAll("#fleet-chart polyline").length >= 2 && `+
		sum+`("trie") > 0 && !document.querySelector('.route-state[data-route="chat"] .decisions').textContent.includes("none yet")`)
	p.shot("fleet")

	// The generation the Fleet page names is the store's, the one the Audit page lists.
	var info struct{ Generation int64 }
	r = e.su("GET", "/api/v1/info", nil)
	want(t, r, 200, "")
	r.json(t, &info)
	p.wait("the store generation", `document.getElementById("fleet-status").textContent.includes("store generation `+strconv.FormatInt(info.Generation, 10)+`")`)

	// A narrow window: the tables become cards, nothing scrolls sideways.
	p.do("a narrow window", chromedp.EmulateViewport(390, 844))
	p.wait("no horizontal scrolling", `innerWidth === 390 && document.documentElement.scrollWidth <= innerWidth`)
	p.shot("fleet-narrow")
	// Just wider than the cards' breakpoint, the tables are at their tightest; and at 1400 px.
	p.do("a window just wider than the cards", chromedp.EmulateViewport(780, 900))
	p.wait("whole table headers on Fleet at 780 px", wholeHeaders)
	p.do("a wide window", chromedp.EmulateViewport(1400, 900))
	p.wait("whole table headers on Fleet", wholeHeaders)

	// The routes list and the audit log.
	p.do("open Routes", chromedp.Click(chromedp.CSS(`#nav a[data-page="routes"]`)))
	p.wait("the route listed", `[...document.querySelectorAll("main tbody tr")].some((r) => r.textContent.includes("chat") && r.textContent.includes("cache_aware"))`)
	p.wait("whole table headers on Routes", wholeHeaders)
	p.shot("routes")
	p.do("open the audit log", chromedp.Click(chromedp.CSS(`#nav a[data-page="audit"]`)))
	p.wait("the changes", `(() => {
		const rows = [...document.querySelectorAll("main tbody tr")].map((r) => r.textContent);
		return rows.some((r) => r.includes("provider") && r.includes("gpu-a")) && rows.some((r) => r.includes("revoke"));
	})()`)
	p.wait("whole table headers on Audit", wholeHeaders)
	p.shot("audit")

	// A control plane without a token (open, on loopback) lets the dashboard in without the sign-in form.
	openSrv, err := control.NewServer(control.Options{Store: e.store, File: e.file.Load, Apply: e.gw.Reload, State: e.gw.State, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	openHS := httptest.NewServer(openSrv.Handler())
	defer openHS.Close()
	p.do("open the dashboard of an open control plane", chromedp.Navigate(openHS.URL+"/dashboard/#/audit"))
	p.wait("the audit log, signed in with no token", `document.getElementById("login").hidden && document.getElementById("whoami").textContent.includes("open") && document.querySelectorAll("main tbody tr").length > 0 && !sessionStorage.getItem("rolter.token")`)

	// The control plane goes away: the page says so. (Back on the first one, signed in from sessionStorage.)
	p.do("open Fleet", chromedp.Navigate(p.origin+"/dashboard/#/fleet"))
	p.wait("the live state", `document.getElementById("fleet-status")?.textContent.startsWith("Updated")`)
	e.closeAPI()
	p.wait("the banner", `!document.getElementById("conn").hidden && document.getElementById("conn").textContent.includes("unreachable") && document.getElementById("fleet-status").textContent.includes("unreachable")`)
	p.shot("unreachable")

	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.problems {
		t.Errorf("the page: %s", m)
	}
	for _, u := range p.requests {
		if !(strings.HasPrefix(u, p.origin+"/") || strings.HasPrefix(u, openHS.URL+"/")) || strings.Contains(u, rootToken) || strings.Contains(u, key) {
			t.Errorf("the page requested %q: outside its origin %s, or with a secret in the URL", u, p.origin)
		}
	}
	if len(p.requests) < 20 {
		t.Errorf("only %d requests were seen: the network watch is broken", len(p.requests))
	}
	if logs := e.logs.String(); strings.Contains(logs, rootToken) || strings.Contains(logs, key) {
		t.Error("a secret reached the log")
	}
	t.Logf("%d requests from the page; screenshots in %s; %s in all", len(p.requests), p.shots, time.Since(start).Round(time.Millisecond))
}
