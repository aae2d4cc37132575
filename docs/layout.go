package docs

import "html/template"

// layoutData is what the page template is given.
type layoutData struct {
	Title   string
	Body    template.HTML
	Nav     []navItem
	Current string // the page's own served path
	Root    string // relative path to the site's root ("" or "../")
}

// layout is the one page template: the navigation list beside the page. Every link is relative, so the
// site works under any mount prefix (/docs/ on the control plane, or another host's path).
var layout = template.Must(template.New("page").Funcs(template.FuncMap{
	"rel": func(root, u string) string {
		if r := root + u[1:]; r != "" {
			return r
		}
		return "./"
	},
}).Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.Title}} · Rolter documentation</title>
<link rel="stylesheet" href="{{.Root}}style.css">
</head>
<body>
<nav id="docs-nav" aria-label="Documentation">
<p class="home"><a href="{{rel .Root "/"}}">Rolter documentation</a></p>
<ul>
{{- range .Nav}}
<li{{if .Folder}} class="section"{{end}}><a href="{{rel $.Root .URL}}"{{if eq .URL $.Current}} aria-current="page"{{end}}>{{.Title}}</a></li>
{{- end}}
</ul>
</nav>
<main id="docs-page">
{{.Body}}
</main>
</body>
</html>
`))
