package docs

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
)

// serve mounts the site at /docs/ on a loopback server, as the control plane does.
func serve(t *testing.T) (*Site, *httptest.Server) {
	t.Helper()
	site, err := NewSite()
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(http.StripPrefix("/docs", site))
	t.Cleanup(hs.Close)
	hs.Client().CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return site, hs
}

func get(t *testing.T, hs *httptest.Server, p string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("GET", hs.URL+p, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = p // sent as written: the client must not clean "..", "//" or escapes
	r, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return r, string(b)
}

var linkAttr = regexp.MustCompile(`(?:href|src)="([^"]*)"`)

func TestEveryPageRendersAndLinksResolve(t *testing.T) {
	site, hs := serve(t)
	pages := site.Pages()
	if len(pages) < 20 {
		t.Fatalf("%d pages, want the whole documentation: %v", len(pages), pages)
	}
	for _, p := range pages {
		r, body := get(t, hs, "/docs"+p)
		if r.StatusCode != 200 || r.Header.Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("%s: %d %s", p, r.StatusCode, r.Header.Get("Content-Type"))
		}
		if !strings.Contains(body, `<nav id="docs-nav"`) || !strings.Contains(body, "<h1") {
			t.Fatalf("%s: no navigation or heading:\n%s", p, body)
		}
		if strings.Contains(body, "<script") || strings.Contains(body, "style=") || strings.Contains(body, "<!-- raw HTML omitted -->") {
			t.Fatalf("%s: script, inline style or raw HTML in the page", p)
		}
		base, _ := url.Parse("http://x/docs" + p)
		for _, m := range linkAttr.FindAllStringSubmatch(body, -1) {
			dest := strings.ReplaceAll(m[1], "&amp;", "&")
			u, err := url.Parse(dest)
			if err != nil {
				t.Fatalf("%s: bad link %q", p, dest)
			}
			if u.Scheme == "https" || u.Scheme == "http" || u.Scheme == "mailto" || (u.Path == "" && u.Fragment != "") {
				continue
			}
			if strings.HasPrefix(dest, "/") {
				t.Fatalf("%s: absolute link %q breaks under another mount; write it relative", p, dest)
			}
			abs := base.ResolveReference(u)
			if !strings.HasPrefix(abs.Path, "/docs/") || !site.Has(strings.TrimPrefix(abs.Path, "/docs")) {
				t.Fatalf("%s: link %q resolves to %s, which the site does not serve", p, dest, abs.Path)
			}
		}
	}
}

func TestPathsAndHeaders(t *testing.T) {
	_, hs := serve(t)
	f := func(p string, status int, location string) {
		t.Helper()
		r, _ := get(t, hs, p)
		if r.StatusCode != status {
			t.Fatalf("%s: %d, want %d", p, r.StatusCode, status)
		}
		if got := r.Header.Get("Location"); got != location {
			t.Fatalf("%s: Location %q, want %q", p, got, location)
		}
		if r.Header.Get("Content-Security-Policy") != CSP || r.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: headers %v", p, r.Header)
		}
	}
	f("/docs/", 200, "")
	f("/docs/routing/", 200, "")
	f("/docs/routing/cache-aware", 200, "")
	f("/docs/api/dashboard.png", 200, "")
	f("/docs/style.css", 200, "")
	f("/docs/routing/cache-aware.md", 301, "../routing/cache-aware")
	f("/docs/routing/README.md", 301, "../routing/")
	f("/docs/architecture.md", 301, "architecture")
	f("/docs/README.md", 301, "./")
	f("/docs/routing", 301, "routing/")
	f("/docs/routing/nope", 404, "")
	f("/docs/routing/../architecture", 404, "")
	f("/docs/routing//cache-aware", 404, "")
	f("/docs//architecture", 404, "")
	f("/docs/./architecture", 404, "")
	f("/docs/routing/%2e%2e/architecture", 404, "")
	f("/docs/routing%2fcache-aware", 404, "")
	f("/docs/embed.go", 404, "")
	f("/docs/routing/cache-aware/", 404, "")
	if !strings.Contains(CSP, "default-src 'none'") || strings.Contains(CSP, "unsafe-inline") || strings.Contains(CSP, "script-src") {
		t.Fatalf("CSP %q allows script", CSP)
	}
}

func TestServedLink(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		if got := servedLink(in); got != want {
			t.Fatalf("servedLink(%q) = %q, want %q", in, got, want)
		}
	}
	f("cache-aware.md", "cache-aware")
	f("../configuration/egress.md#the-policy", "../configuration/egress#the-policy")
	f("README.md", "./")
	f("../routing/README.md", "../routing/")
	f("index.md#x", "./#x")
	f("dashboard.png", "dashboard.png")
	f("https://example.test/a.md", "https://example.test/a.md")
	f("#anchor", "#anchor")
}

// TestReadmeLinksResolve checks that every link of the repository's README.md into docs/ names a file.
func TestReadmeLinksResolve(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range regexp.MustCompile(`\]\(([^)\s]+)\)`).FindAllStringSubmatch(string(b), -1) {
		dest, _, _ := strings.Cut(m[1], "#")
		if !strings.HasPrefix(dest, "docs/") {
			continue
		}
		n++
		if _, err := os.Stat(path.Join("..", dest)); err != nil {
			t.Fatalf("README.md links %q: %v", m[1], err)
		}
	}
	if n < 15 {
		t.Fatalf("README.md links %d docs pages, want every page", n)
	}
}
