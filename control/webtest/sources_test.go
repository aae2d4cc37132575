package webtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/control"
	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/engine"
)

// sinkWatcher hands the test the Sink of the source it follows.
type sinkWatcher chan discovery.Sink

func (w sinkWatcher) Watch(ctx context.Context, sink discovery.Sink) {
	w <- sink
	<-ctx.Done()
}

// TestDashboardSources: the Fleet page shows each discovery source under the routes, its endpoints with
// their states, and a source that fails as failing with its error while its last set stands; the state
// answer fits openapi.json.
func TestDashboardSources(t *testing.T) {
	stub := newEngineStub(t)
	u, _ := url.Parse(stub.URL)
	port, _ := strconv.Atoi(u.Port())
	file := parseFile(t, fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[sources]]
name = "pool"
kind = "dns"
port = %d
[sources.dns]
name = "pool.test"
record = "a"
[sources.provider]
api_base = "http://{ip}:{port}"
[[routes]]
model = "chat"
[[routes.targets]]
source = "pool"
`, port))
	sinks := make(sinkWatcher, 1)
	fleet := discovery.New(discovery.Options{Logger: slog.New(slog.DiscardHandler),
		NewWatcher: func(*config.SourceConfig) (discovery.Watcher, error) { return sinks, nil }})
	t.Cleanup(fleet.Close)
	ep := func(ip, name string, ready bool) discovery.Endpoint {
		return discovery.Endpoint{Addr: netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port)), Name: name, Ready: ready, Terminating: !ready}
	}
	var sink discovery.Sink
	go func() {
		sink = <-sinks
		sink.Set([]discovery.Endpoint{ep("127.0.0.1", "vllm-0", true), ep("127.0.0.2", "vllm-1", false)})
	}()
	cfg, err := fleet.Prepare(file)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := engine.New(cfg, engine.Options{Logger: slog.New(slog.DiscardHandler), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Shutdown(context.Background()) })
	fleet.Attach(gw.Reload)
	st, err := store.Open(filepath.Join(t.TempDir(), "rolter.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := control.NewServer(control.Options{Store: st, File: func() *config.Config { return file }, Apply: fleet.Apply,
		State: gw.State, Sources: fleet.Status, Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	api := &apiClient{t: t, base: hs.URL}
	want(t, api.do("GET", "/api/v1/state", "", nil), 200, "")

	p := newTab(t, hs.URL)
	p.do("open Fleet", chromedp.Navigate(hs.URL+"/dashboard/#/fleet"))
	endpoint := func(name, state string) string {
		return `document.querySelector('section[data-source="pool"] tr[data-provider="pool@` + name + `:` + u.Port() + `"][data-state="` + state + `"]')`
	}
	p.wait("the source and its endpoints", endpoint("127.0.0.1", "live")+` && `+endpoint("127.0.0.2", "terminating")+` && `+
		`document.querySelector('section[data-source="pool"] [data-col="source-health"]').textContent.startsWith("up") && `+
		`document.querySelector('section[data-source="pool"] h2').textContent.includes("1 live, 1 terminating")`)
	p.shot("fleet-sources")
	sink.Fail(errors.New("dns: no answer from 127.0.0.53:53"))
	p.wait("the failing source, its last set standing", `document.querySelector('section[data-source="pool"] [data-col="source-health"]').textContent.includes("no answer from 127.0.0.53:53; the last set stands") && `+
		endpoint("127.0.0.1", "live"))
	want(t, api.do("GET", "/api/v1/state", "", nil), 200, "")
}
