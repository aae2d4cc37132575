package control

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// The dashboard is plain HTML, CSS and ES modules in dashboard/, embedded in the binary: no build
// step, no CDN, nothing fetched at run time but the control plane's own /api/v1. It is served to anyone
// (it holds no data); the admin token a user types is kept in the tab's sessionStorage and sent as
// Authorization: Bearer to the API, never in a URL.
//
// Documentation links: the route sheet links the chosen strategy, and the footer the documentation's
// home, under [docs] base_url (GET /api/v1/info; the control plane's own /docs when rolter.toml sets none,
// docs.go): the strategy to <base_url>/routing/<strategy with "-" for "_">, e.g.
// <base_url>/routing/precise-cache-aware; the paths are the "docs" of dashboard/strategies.json, and a
// documentation site keeps them stable.
//
//go:embed dashboard
var dashboardFiles embed.FS

// dashboardCSP is the Content-Security-Policy of every dashboard answer (W3C CSP Level 3): everything from
// this origin only, no inline script or style, no plugins, no framing, no <base>. Trusted Types are
// required for script sinks: the dashboard builds its pages with DOM calls and text nodes only (dom.js), so
// an innerHTML assignment - the way API data could turn into markup - throws instead of running.
const dashboardCSP = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; " +
	"frame-ancestors 'none'; require-trusted-types-for 'script'"

// dashboardTypes are the media types of the dashboard's files, by extension: set here rather than taken
// from the system's mime tables, so a module script is always JavaScript (browsers refuse a module with
// another type under nosniff).
var dashboardTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".json": "application/json",
	".svg":  "image/svg+xml",
}

// asset is one embedded file, read once.
type asset struct {
	body  []byte
	ctype string
	etag  string // a strong validator of the content: a new binary with changed assets never serves stale ones
}

// dashboard serves the embedded assets at /dashboard/. It is read-only after newDashboard and safe for
// concurrent use.
type dashboard struct {
	assets map[string]*asset // by path under dashboard/, "index.html" for the folder itself
}

// newDashboard reads every embedded asset. A file of a type it does not know is a broken build.
func newDashboard() (*dashboard, error) {
	d := &dashboard{assets: map[string]*asset{}}
	err := fs.WalkDir(dashboardFiles, "dashboard", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		ctype, ok := dashboardTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("cannot serve dashboard asset %q: unknown type", p)
		}
		body, err := dashboardFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		d.assets[strings.TrimPrefix(p, "dashboard/")] = &asset{body: body, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot load the dashboard: %w", err)
	}
	if d.assets["index.html"] == nil {
		return nil, fmt.Errorf("cannot load the dashboard: no index.html")
	}
	return d, nil
}

// ServeHTTP serves GET and HEAD /dashboard/<file>. index.html is never cached (it names the other assets,
// and a new binary may change them); the others are revalidated on every use by their ETag.
func (d *dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	name := strings.TrimPrefix(r.URL.Path, "/dashboard/")
	if name == "" {
		name = "index.html"
	}
	a := d.assets[name]
	if a == nil {
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, "no dashboard file %q\n", name)
		return
	}
	h.Set("Content-Type", a.ctype)
	if name == "index.html" {
		h.Set("Cache-Control", "no-store")
	} else {
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
	}
	// ServeContent answers If-None-Match with 304, HEAD without a body, and Range; the zero time sends no
	// Last-Modified (embedded files have none).
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
}

// redirectDashboard sends /dashboard to /dashboard/, where the assets' relative paths resolve.
func redirectDashboard(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/dashboard/", http.StatusMovedPermanently)
}
