package control

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
)

// newStaticServer serves a control plane over loopback on the default file config, a store of its own and
// no gateway behind it: what the dashboard's assets and the documentation need. Its client does not
// follow redirects, so a test sees them.
func newStaticServer(t *testing.T) (*httptest.Server, *http.Client) {
	t.Helper()
	st := openStoreAt(t, filepath.Join(t.TempDir(), "rolter.db"))
	srv, err := NewServer(Options{
		Store: st, File: config.Default, Apply: func(*config.Config) error { return nil },
		State: func() engine.State { return engine.State{} }, AdminToken: rootToken, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	client := hs.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return hs, client
}
