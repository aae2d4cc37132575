package webtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
)

// browserPath finds Chromium: the test skips without one, unless ROLTER_REQUIRE_BROWSER=1 (make test).
func browserPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if found, err := exec.LookPath(p); err == nil {
			return found
		}
	}
	if os.Getenv("ROLTER_REQUIRE_BROWSER") == "1" {
		t.Fatal("no Chromium (/usr/bin/chromium), and ROLTER_REQUIRE_BROWSER=1: run make deps")
	}
	t.Skip("no Chromium (/usr/bin/chromium): make deps installs it; ROLTER_REQUIRE_BROWSER=1 makes this a failure")
	return ""
}

// tab drives one headless Chromium tab and watches what the dashboard does in it: uncaught exceptions,
// errors it logs, CSP or Trusted Types violations, and every request it makes.
type tab struct {
	t      *testing.T
	ctx    context.Context
	origin string // the control plane's, http://127.0.0.1:port
	shots  string

	mu       sync.Mutex
	problems []string
	requests []string
}

func newTab(t *testing.T, origin string, flags ...chromedp.ExecAllocatorOption) *tab {
	t.Helper()
	exe := browserPath(t)
	shots := os.Getenv("ROLTER_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	p := &tab{t: t, origin: origin, shots: shots}
	// Headless on a CI machine: no sandbox (tests may run as root), no GPU, and none of Chromium's own
	// background connections (component updates, QUIC), which a closed network refuses.
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("lang", "en-US"),
	)
	opts = append(opts, flags...)
	// The whole browser session is bounded: a hung step fails the test instead of stalling the suite.
	base, cancelBase := context.WithTimeout(context.Background(), 55*time.Second)
	alloc, cancelAlloc := chromedp.NewExecAllocator(base, opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc, chromedp.WithListener(p.watch))
	t.Cleanup(func() {
		cancelCtx()
		cancelAlloc()
		cancelBase()
	})
	p.ctx = ctx
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 900)); err != nil {
		t.Fatalf("cannot start Chromium %s: %s", exe, err)
	}
	return p
}

// watch runs in the tab's event loop: it only records.
func (p *tab) watch(ev any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		p.problems = append(p.problems, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			p.problems = append(p.problems, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
		}
	case *cdplog.EventEntryAdded:
		// Answers other than 2xx (the refused saves) and the closed control plane at the end are logged by
		// the network; everything else at error level, CSP and Trusted Types violations among it, is a
		// problem.
		if e := ev.Entry; e.Source != cdplog.EntrySourceNetwork && (e.Level == cdplog.EntryLevelError || strings.Contains(e.Text, "Content Security Policy") || strings.Contains(e.Text, "Trusted Type")) {
			p.problems = append(p.problems, fmt.Sprintf("log %s/%s: %s (%s)", e.Source, e.Level, e.Text, e.URL))
		}
	case *network.EventRequestWillBeSent:
		p.requests = append(p.requests, ev.Request.URL)
	}
}

// do runs steps, failing the test with what on an error.
func (p *tab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	if err := chromedp.Do(p.ctx, steps...); err != nil {
		p.t.Fatalf("%s: %s\n%s", what, err, p.mainText())
	}
}

// wait waits until the JavaScript expression is truthy (15 s at most): the tests wait on what the page
// shows, never for a fixed time. The expression is checked every 25 ms by a loop evaluated in the page.
// (chromedp.Poll cannot be used: it builds its predicate with new Function, which the dashboard's CSP
// refuses, as it refuses every eval.)
func (p *tab) wait(what, expr string) {
	p.t.Helper()
	loop := `new Promise((resolve) => {
		const end = Date.now() + 15000;
		const tick = () => {
			let ok = false;
			try { ok = !!(` + expr + `); } catch (e) { ok = false; }
			if (ok) resolve(true); else if (Date.now() > end) resolve(false); else setTimeout(tick, 25);
		};
		tick();
	})`
	ok, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](loop, chromedp.EvalAwaitPromise))
	if err != nil || !ok {
		p.t.Fatalf("waiting for %s (%s): not within 15s (%v)\n%s", what, expr, err, p.mainText())
	}
}

// eval returns the value of a JavaScript expression.
func eval[T any](p *tab, expr string) T {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.t.Fatalf("evaluate %s: %s", expr, err)
	}
	return v
}

// mainText is what the page shows, for failure messages.
func (p *tab) mainText() string {
	ctx, cancel := context.WithTimeout(p.ctx, 2*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash + "\n" + document.body.innerText`))
	if err != nil {
		return "(cannot read the page: " + err.Error() + ")"
	}
	return "the page shows:\n" + s
}

// shot saves a PNG of the whole page (beyond the viewport) as <shots>/<name>.png.
func (p *tab) shot(name string) {
	p.t.Helper()
	size := eval[[]float64](p, `[document.documentElement.clientWidth, Math.max(document.documentElement.scrollHeight, innerHeight)]`)
	png, err := chromedp.Run(p.ctx, func(ctx context.Context, t *chromedp.Target) ([]byte, error) {
		r, err := cdp.Call(ctx, t, page.CaptureScreenshot, page.CaptureScreenshotParams{
			Format:                page.CaptureScreenshotFormatPng,
			CaptureBeyondViewport: new(true),
			Clip:                  &page.Viewport{X: 0, Y: 0, Width: size[0], Height: math.Min(size[1], 4000), Scale: 1},
		})
		return r.Data, err
	})
	if err != nil {
		p.t.Fatalf("screenshot %s: %s", name, err)
	}
	if err := os.WriteFile(filepath.Join(p.shots, name+".png"), png, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// retype replaces what a text field holds, by keyboard: select all, delete, type.
func retype[S chromedp.Selectable](sel S, text string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(
		chromedp.Focus(sel),
		chromedp.KeyEvent("a", chromedp.KeyModifiers(chromedp.ModifierCtrl)),
		chromedp.KeyEvent(kb.Delete),
		chromedp.SendKeys(sel, text),
	)
}
