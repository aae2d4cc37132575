package docs

import (
	"bytes"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/ast"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"
	"github.com/yuin/goldmark/text"
	"github.com/yuin/goldmark/util"
)

// markdown is the renderer of every page: CommonMark with GitHub's tables, strikethrough, autolinks and
// task lists, heading ids for anchors, and raw HTML dropped (goldmark's default: a page cannot carry a
// script). Table alignment is an align attribute, not a style one, so the pages need no inline style
// under the Content-Security-Policy.
var markdown = goldmark.New(
	goldmark.WithExtensions(
		extension.NewTable(extension.WithTableCellAlignMethod(extension.TableCellAlignAttribute)),
		extension.Strikethrough, extension.Linkify, extension.TaskList, // the rest of extension.GFM
	),
	goldmark.WithParserOptions(parser.WithAutoHeadingID(), parser.WithASTTransformers(util.Prioritized(linkRewriter{}, 100))),
)

// render turns one page's Markdown into HTML and returns it with the text of its first heading (the
// page's title, "" without one).
func render(src []byte) (body []byte, title string, err error) {
	doc := markdown.Parser().Parse(text.NewReader(src))
	title = firstHeading(doc, src)
	var buf bytes.Buffer
	if err := markdown.Renderer().Render(&buf, src, doc); err != nil {
		return nil, "", fmt.Errorf("cannot render the page: %w", err)
	}
	return buf.Bytes(), title, nil
}

// firstHeading returns the plain text of the first heading of doc.
func firstHeading(doc ast.Node, src []byte) string {
	for n := doc.FirstChild(); n != nil; n = n.NextSibling() {
		if h, ok := n.(*ast.Heading); ok {
			var b strings.Builder
			collectText(h, src, &b)
			return b.String()
		}
	}
	return ""
}

// collectText appends the text segments under n to b.
func collectText(n ast.Node, src []byte, b *strings.Builder) {
	for c := n.FirstChild(); c != nil; c = c.NextSibling() {
		switch t := c.(type) {
		case *ast.Text:
			b.Write(t.Segment.Value(src))
		case *ast.String:
			b.Write(t.Value)
		default:
			collectText(c, src, b)
		}
	}
}

// linkRewriter turns the links between pages, written as file paths so they work on a forge too, into
// the served paths: foo.md -> foo, README.md and index.md -> their folder.
type linkRewriter struct{}

// Transform rewrites every link destination of the page in place.
func (linkRewriter) Transform(doc *ast.Document, _ text.Reader, _ parser.Context) {
	_ = ast.Walk(doc, func(n ast.Node, entering bool) (ast.WalkStatus, error) {
		if l, ok := n.(*ast.Link); ok && entering {
			l.Destination = []byte(servedLink(string(l.Destination)))
		}
		return ast.WalkContinue, nil
	})
}

// servedLink returns the served form of a link destination: a relative link to a .md file loses the
// extension (a README.md or index.md becomes its folder, "./" for the page's own); any other link is
// returned as it is.
func servedLink(dest string) string {
	u, err := url.Parse(dest)
	if err != nil || u.Scheme != "" || u.Host != "" || strings.HasPrefix(u.Path, "/") || !strings.HasSuffix(u.Path, ".md") {
		return dest
	}
	dir, file := path.Split(u.Path)
	switch file {
	case "README.md", "index.md":
		if dir == "" {
			dir = "./"
		}
		u.Path = dir
	default:
		u.Path = strings.TrimSuffix(u.Path, ".md")
	}
	return u.String()
}
