// Package docs holds Rolter's documentation as Markdown pages by topic (routing/, configuration/, api/,
// observability/, deployment/, benchmarks/) and serves them as HTML: the control plane mounts the Site
// at /docs/, which is the default [docs] base_url the dashboard links strategies to.
package docs

import "embed"

// files are the pages and the images they show. A page docs/routing/cache-aware.md is served at
// <base>/routing/cache-aware, a folder's README.md at <base>/routing/.
//
//go:embed *.md */*.md */*.png style.css
var files embed.FS
