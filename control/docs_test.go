package control

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestDocsLinksAnswer fetches every documentation link the dashboard can show - the footer's and the page
// of every strategy in dashboard/strategies.json - resolved against the default base the control plane
// reports, plus every page the product's spec links, from a real control plane over loopback.
func TestDocsLinksAnswer(t *testing.T) {
	hs, client := newStaticServer(t)
	get := func(p, token string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+p, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		r, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r, string(b)
	}

	r, body := get("/api/v1/info", rootToken)
	var info infoView
	if err := json.Unmarshal([]byte(body), &info); err != nil || r.StatusCode != 200 {
		t.Fatalf("info: %d %s", r.StatusCode, body)
	}
	if info.DocsBaseURL != "/docs" {
		t.Fatalf("docs_base_url %q without [docs] base_url, want /docs", info.DocsBaseURL)
	}
	base := strings.TrimRight(info.DocsBaseURL, "/")

	f := func(p string) {
		t.Helper()
		r, body := get(p, "")
		if r.StatusCode != 200 || r.Header.Get("Content-Type") != "text/html; charset=utf-8" || !strings.Contains(body, "<h1") {
			t.Fatalf("GET %s: %d %s\n%.300s", p, r.StatusCode, r.Header.Get("Content-Type"), body)
		}
	}
	f(base + "/") // the footer's link (app.js renderFooter)

	raw, err := os.ReadFile("dashboard/strategies.json")
	if err != nil {
		t.Fatal(err)
	}
	var strategies map[string]struct {
		Docs string `json:"docs"`
	}
	if err := json.Unmarshal(raw, &strategies); err != nil {
		t.Fatal(err)
	}
	for name := range config.Strategies {
		if strategies[name].Docs == "" {
			t.Fatalf("strategy %q has no docs page in strategies.json", name)
		}
	}
	for name, s := range strategies {
		if !strings.HasPrefix(s.Docs, "/routing/") {
			t.Fatalf("strategy %q: docs %q, want /routing/...", name, s.Docs)
		}
		f(base + s.Docs) // routes.js docsLink
	}

	// The pages the product's spec (cache-aware-routing) links by path.
	for _, p := range []string{"/routing/", "/routing/cache-aware", "/routing/precise-cache-aware", "/configuration/egress",
		"/api/providers", "/deployment/documentation-links"} {
		f(base + p)
	}

	if r, _ := get("/docs", ""); r.StatusCode != 301 || r.Header.Get("Location") != "/docs/" {
		t.Fatalf("GET /docs: %d %q, want a redirect to /docs/", r.StatusCode, r.Header.Get("Location"))
	}
	for _, p := range []string{"/docs/routing/../api/providers", "/docs//api/providers", "/docs/nope"} {
		req, _ := http.NewRequest("GET", hs.URL, nil)
		req.URL.Opaque = p
		r, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 404 {
			t.Fatalf("GET %s: %d, want 404", p, r.StatusCode)
		}
	}
}
