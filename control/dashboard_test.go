package control

import (
	"io"
	"io/fs"
	"net/http"
	"path"
	"regexp"
	"strings"
	"testing"
)

// The dashboard's tests. TestDashboardAssets checks what the control plane serves under /dashboard/ without
// a browser; the browser test, which drives Debian's Chromium headless (chromedp) through every page, is in
// the nested module control/webtest, so that chromedp stays out of the gateway's go.mod.

// dashboardMediaTypes are the media types each asset must be served with, by extension, written out here
// rather than read from dashboard.go: a module script under nosniff must be JavaScript or the browser
// refuses it (HTML Living Standard, "fetch a single module script").
var dashboardMediaTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".json": "application/json",
	".svg":  "image/svg+xml",
}

// svgNamespace is the one absolute http URL an asset may contain: the SVG namespace name (dom.js,
// icon.svg), an identifier that is never fetched (Namespaces in XML 1.0, section 2).
const svgNamespace = "http://www.w3.org/2000/svg"

// TestDashboardAssets: every file under dashboard/ is served at /dashboard/<file> with its media type, the
// Content-Security-Policy and nosniff; no asset refers to another origin; every file that index.html and
// the modules name is there; /dashboard redirects, unknown files are 404 with the same headers, and a
// known ETag is answered 304.
func TestDashboardAssets(t *testing.T) {
	hs, client := newStaticServer(t)
	get := func(p string, hdr ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+p, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %s", p, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %s", p, err)
		}
		return resp, body
	}
	secure := func(p string, resp *http.Response) {
		t.Helper()
		csp := resp.Header.Get("Content-Security-Policy")
		for _, d := range []string{"default-src 'self'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "object-src 'none'", "frame-ancestors 'none'"} {
			if !strings.Contains(csp, d) {
				t.Errorf("%s: Content-Security-Policy %q lacks %q", p, csp, d)
			}
		}
		if strings.Contains(csp, "unsafe-") || strings.Contains(csp, "http") || strings.Contains(csp, "*") {
			t.Errorf("%s: Content-Security-Policy %q allows more than this origin", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no X-Content-Type-Options: nosniff", p)
		}
	}

	absURL := regexp.MustCompile(`(?i)\bhttps?://[^\s"'<>()\x60]*`)
	// Protocol-relative and CSS references: src="//host", url(//host), @import.
	otherRef := regexp.MustCompile(`(?i)(?:\b(?:src|href|action)\s*=\s*["']?\s*//|url\(\s*["']?\s*(?:https?:)?//|@import)`)
	htmlRef := regexp.MustCompile(`\b(?:src|href)="([^"#][^"]*)"`)
	jsRef := regexp.MustCompile(`(?:\bfrom\s+|\bimport\s*\(\s*|\bfetch\(\s*)"([^"]+)"`)
	names := map[string]bool{}
	refs := map[string][]string{} // file -> the files it names
	err := fs.WalkDir(dashboardFiles, "dashboard", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := strings.TrimPrefix(p, "dashboard/")
		names[name] = true
		want, ok := dashboardMediaTypes[path.Ext(name)]
		if !ok {
			t.Errorf("%s: no media type is known for it", name)
			return nil
		}
		embedded, _ := dashboardFiles.ReadFile(p)
		resp, body := get("/dashboard/" + name)
		if resp.StatusCode != 200 || string(body) != string(embedded) {
			t.Errorf("GET /dashboard/%s: %d, %d bytes; want 200 and the embedded %d bytes", name, resp.StatusCode, len(body), len(embedded))
		}
		if got := resp.Header.Get("Content-Type"); got != want {
			t.Errorf("GET /dashboard/%s: Content-Type %q, want %q", name, got, want)
		}
		secure("/dashboard/"+name, resp)
		for _, u := range absURL.FindAllString(string(body), -1) {
			if u != svgNamespace {
				t.Errorf("%s refers to %q, outside the page's origin", name, u)
			}
		}
		if m := otherRef.FindString(string(body)); m != "" {
			t.Errorf("%s has a reference outside the page's origin: %q", name, m)
		}
		re := jsRef
		if path.Ext(name) == ".html" {
			re = htmlRef
		}
		for _, m := range re.FindAllStringSubmatch(string(body), -1) {
			refs[name] = append(refs[name], strings.TrimPrefix(m[1], "./"))
		}
		if etag := resp.Header.Get("ETag"); etag != "" {
			if resp, _ := get("/dashboard/"+name, "If-None-Match", etag); resp.StatusCode != http.StatusNotModified {
				t.Errorf("GET /dashboard/%s with its ETag: %d, want 304", name, resp.StatusCode)
			}
		} else if name != "index.html" {
			t.Errorf("GET /dashboard/%s: no ETag", name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(refs["index.html"]) < 3 || len(refs["app.js"]) < 5 {
		t.Fatalf("found too few references to check (%v): the patterns no longer match the assets", refs)
	}
	for from, tos := range refs {
		for _, to := range tos {
			if !names[to] {
				t.Errorf("%s names %q, which is not an embedded asset", from, to)
			}
		}
	}

	resp, body := get("/dashboard/")
	if index, _ := dashboardFiles.ReadFile("dashboard/index.html"); resp.StatusCode != 200 || string(body) != string(index) ||
		resp.Header.Get("Content-Type") != dashboardMediaTypes[".html"] || resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("GET /dashboard/: %d %v, want index.html, never cached", resp.StatusCode, resp.Header)
	}
	secure("/dashboard/", resp)
	if resp, _ := get("/dashboard"); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/dashboard/" {
		t.Errorf("GET /dashboard: %d to %q, want 301 to /dashboard/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, _ = get("/dashboard/nope.js")
	if resp.StatusCode != 404 {
		t.Errorf("GET /dashboard/nope.js: %d, want 404", resp.StatusCode)
	}
	secure("/dashboard/nope.js", resp)
}

// TestAPIInfo: GET /api/v1/info tells the dashboard the version, the store's generation, the live file's
// [docs] base_url (after a reload, without a restart) and whether the caller is the superadmin.
func TestAPIInfo(t *testing.T) {
	e := newEnv(t, "")
	f := func(token string, super bool, docs string, gen int64) {
		t.Helper()
		r := e.api.do("GET", "/api/v1/info", token, nil)
		want(t, r, 200, "")
		var v infoView
		r.json(t, &v)
		if v != (infoView{Version: "dev", Generation: gen, DocsBaseURL: docs, Superadmin: super}) {
			t.Fatalf("info %+v, want version dev, generation %d, docs %q, superadmin %v", v, gen, docs, super)
		}
	}
	f(rootToken, true, "/docs", 0)
	a := e.mkOrg("a")
	tok, _ := e.mkToken(a)
	f(tok, false, "/docs", 2)
	want(t, e.api.do("GET", "/api/v1/info", "", nil), 401, "unauthorized")
	e.file.Store(parseFile(t, fileConfigText(e.S.URL)+"[docs]\nbase_url = \"https://docs.rolter.test\"\n"))
	if err := e.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	f(tok, false, "https://docs.rolter.test", 2)
}
