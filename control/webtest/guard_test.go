package webtest

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestControlCrossOriginBrowser performs the attack in Chromium: a page of another origin (another port of
// 127.0.0.1) submits a text/plain form and a no-cors text/plain fetch to /api/v1/orgs of an open control
// plane; both reach it and neither creates an org. Then the attacker's name resolves to the control plane
// (DNS rebinding, by Chromium's host resolver rules): the dashboard is not served under it.
func TestControlCrossOriginBrowser(t *testing.T) {
	browserPath(t)
	e := newEnv(t)
	base, hits := openControl(t, e)
	page := fmt.Sprintf(`<!doctype html><body><form id="f" method="POST" action="%[1]s/api/v1/orgs" enctype="text/plain">
<input name='{"name":"evil-form","x":"' value='"}'></form>
<script>
fetch(%[1]q + "/api/v1/orgs", {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body: '{"name":"evil-fetch"}'})
  .finally(() => document.getElementById("f").submit());
</script></body>`, base)
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, page)
	}))
	defer attacker.Close()
	port := base[strings.LastIndex(base, ":")+1:]
	p := newTab(t, base, chromedp.Flag("host-resolver-rules", "MAP evil.example 127.0.0.1"))
	p.do("open the attacker's page", chromedp.Navigate(attacker.URL))
	deadline := time.Now().Add(15 * time.Second)
	for hits.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(25 * time.Millisecond)
	}
	if n := hits.Load(); n < 2 {
		t.Fatalf("%d of the page's 2 requests reached the control plane", n)
	}
	if names := orgNames(t, e); len(names) != 0 {
		t.Fatalf("a page of another origin created orgs %q", names)
	}

	p.do("open the dashboard under the attacker's name", chromedp.Navigate("http://evil.example:"+port+"/dashboard/"))
	if got := eval[string](p, "document.body.innerText"); !strings.Contains(got, "misdirected_request") {
		t.Fatalf("the dashboard under the attacker's name shows %q", got)
	}
	p.do("open the dashboard under its own name", chromedp.Navigate(base+"/dashboard/"))
	p.wait("the dashboard", `document.querySelector("main") !== null`)
}
