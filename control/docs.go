package control

import (
	"net/http"
	"strings"

	"github.com/rolter-ai/rolter/docs"
)

// DocsPath is where the control plane serves the documentation, and the [docs] base_url GET /api/v1/info
// reports when rolter.toml sets none: a path on the same origin, so the dashboard's links work wherever the
// control plane is reached.
const DocsPath = "/docs"

// withDocs serves the documentation (package docs) at /docs/ ahead of the mux: like the dashboard it
// holds no data and needs no token. It sits before the mux because the mux cleans a path with ".." or
// "//" by redirecting, and the documentation answers such a path 404 instead (one address per page).
func withDocs(site *docs.Site, next http.Handler) http.Handler {
	inner := http.StripPrefix(DocsPath, site)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch p := r.URL.Path; {
		case p == DocsPath:
			http.Redirect(w, r, DocsPath+"/", http.StatusMovedPermanently)
		case strings.HasPrefix(p, DocsPath+"/"):
			inner.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// docsBaseURL is the documentation's base the dashboard links to: [docs] base_url, else DocsPath.
func docsBaseURL(configured string) string {
	if configured == "" {
		return DocsPath
	}
	return configured
}
