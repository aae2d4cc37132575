package docs

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"slices"
	"sort"
	"strings"
)

// CSP is the Content-Security-Policy of every answer: the pages are HTML and a stylesheet from this
// origin, with no script at all, no plugins, no framing and no <base>.
const CSP = "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// fileTypes are the media types of the files beside the pages, by extension.
var fileTypes = map[string]string{
	".png": "image/png",
	".css": "text/css; charset=utf-8",
}

// sections orders the navigation: the folders in the order a newcomer reads them, then any other.
var sections = []string{"", "routing", "configuration", "api", "observability", "deployment", "benchmarks"}

// page is one rendered page.
type page struct {
	url   string // the served path under the site, e.g. "/routing/cache-aware" or "/routing/"
	title string
	body  template.HTML
	html  []byte // the whole answer, rendered once
}

// navItem is one line of the navigation list.
type navItem struct {
	URL, Title string
	Folder     bool // a folder's index: a section heading
}

// Site serves the embedded pages as HTML under any prefix (the caller strips it). It is read-only after
// NewSite and safe for concurrent use.
type Site struct {
	pages map[string]*page  // by served path
	files map[string][]byte // images and the stylesheet, by served path
}

// NewSite renders every embedded page. A page that does not render is a broken build.
func NewSite() (*Site, error) {
	s := &Site{pages: map[string]*page{}, files: map[string][]byte{}}
	err := fs.WalkDir(files, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		body, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		if path.Ext(p) != ".md" {
			s.files["/"+p] = body
			return nil
		}
		html, title, err := render(body)
		if err != nil {
			return fmt.Errorf("cannot render %s: %w", p, err)
		}
		if title == "" {
			return fmt.Errorf("cannot render %s: the page has no heading", p)
		}
		u := pageURL(p)
		s.pages[u] = &page{url: u, title: title, body: template.HTML(html)}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cannot load the documentation: %w", err)
	}
	if s.pages["/"] == nil {
		return nil, fmt.Errorf("cannot load the documentation: no README.md")
	}
	nav := s.nav()
	for _, pg := range s.pages {
		var buf bytes.Buffer
		if err := layout.Execute(&buf, layoutData{Title: pg.title, Body: pg.body, Nav: nav, Current: pg.url, Root: rootFrom(pg.url)}); err != nil {
			return nil, fmt.Errorf("cannot lay out %s: %w", pg.url, err)
		}
		pg.html = buf.Bytes()
	}
	return s, nil
}

// pageURL returns the served path of the page file p: "routing/cache-aware.md" -> "/routing/cache-aware",
// "routing/README.md" -> "/routing/".
func pageURL(p string) string {
	dir, file := path.Split(p)
	if file == "README.md" || file == "index.md" {
		return "/" + dir
	}
	return "/" + strings.TrimSuffix(p, ".md")
}

// rootFrom returns the relative path from the page at u to the site's root, so the pages work under
// any prefix: "" at the root's own level, "../" one folder down.
func rootFrom(u string) string {
	return strings.Repeat("../", strings.Count(u, "/")-1)
}

// nav lists the pages: each section's index first, then its pages by title.
func (s *Site) nav() []navItem {
	bySection := map[string][]*page{}
	for _, pg := range s.pages {
		sec := strings.SplitN(strings.TrimPrefix(pg.url, "/"), "/", 2)[0]
		if !strings.Contains(strings.TrimPrefix(pg.url, "/"), "/") {
			sec = ""
		}
		bySection[sec] = append(bySection[sec], pg)
	}
	order := append([]string(nil), sections...)
	var extra []string
	for sec := range bySection {
		if !slices.Contains(order, sec) {
			extra = append(extra, sec)
		}
	}
	sort.Strings(extra)
	var items []navItem
	for _, sec := range append(order, extra...) {
		pages := bySection[sec]
		sort.Slice(pages, func(i, j int) bool {
			if ix, jx := strings.HasSuffix(pages[i].url, "/"), strings.HasSuffix(pages[j].url, "/"); ix != jx {
				return ix
			}
			return pages[i].title < pages[j].title
		})
		for _, pg := range pages {
			items = append(items, navItem{URL: pg.url, Title: pg.title, Folder: strings.HasSuffix(pg.url, "/")})
		}
	}
	return items
}

// Pages returns the served paths of every page, sorted.
func (s *Site) Pages() []string {
	out := make([]string, 0, len(s.pages))
	for u := range s.pages {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// Has reports whether the site serves p (a page or a file).
func (s *Site) Has(p string) bool {
	_, ok := s.pages[p]
	_, isFile := s.files[p]
	return ok || isFile
}

// ServeHTTP answers GET and HEAD of a page or file, the path relative to where the site is mounted. A
// path that is not clean (a "..", ".", an empty segment) is 404 rather than cleaned, so one page has one
// address; /x.md redirects to /x, and a folder without its slash to the folder.
func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "the documentation is read-only", http.StatusMethodNotAllowed)
		return
	}
	p := r.URL.Path
	if p == "" {
		p = "/"
	}
	if !clean(p) || !clean(r.URL.EscapedPath()) {
		http.NotFound(w, r)
		return
	}
	if pg := s.pages[p]; pg != nil {
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodGet {
			w.Write(pg.html)
		}
		return
	}
	if body, ok := s.files[p]; ok {
		h.Set("Content-Type", fileTypes[path.Ext(p)])
		h.Set("Cache-Control", "no-cache")
		if r.Method == http.MethodGet {
			w.Write(body)
		}
		return
	}
	if to := s.redirect(p); to != "" {
		// Relative to the request's own folder, so the redirect holds under any mount prefix; set by hand,
		// because http.Redirect makes a relative reference absolute from the stripped path.
		h.Set("Location", relativeTo(p, to))
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusMovedPermanently)
		return
	}
	http.NotFound(w, r)
}

// redirect returns the page a near-miss path means: /x.md -> /x, /routing/README.md and /routing ->
// /routing/. "" when none.
func (s *Site) redirect(p string) string {
	for _, to := range []string{pageURL(strings.TrimPrefix(p, "/")), p + "/"} {
		if to != p && s.pages[to] != nil && (strings.HasSuffix(p, ".md") || to == p+"/") {
			return to
		}
	}
	return ""
}

// relativeTo returns the reference from the path from to the path to, both under the same root.
func relativeTo(from, to string) string {
	ref := rootFrom(from) + strings.TrimPrefix(to, "/")
	if ref == "" {
		return "./"
	}
	return ref
}

// clean reports whether p is a clean absolute path: no "." or ".." segment, no empty one but a final
// slash's, no backslash.
func clean(p string) bool {
	if !strings.HasPrefix(p, "/") || strings.Contains(p, "\\") || strings.Contains(p, "//") {
		return false
	}
	for _, seg := range strings.Split(p[1:], "/") {
		low := strings.ToLower(seg)
		if seg == "." || seg == ".." || low == "%2e" || low == "%2e%2e" || low == ".%2e" || low == "%2e." || strings.Contains(low, "%2f") {
			return false
		}
	}
	return true
}
