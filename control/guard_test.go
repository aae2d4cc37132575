package control

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
)

// openControl serves a control plane in open mode (no superadmin token) on a real loopback port, as
// `rolter serve` does with listen = "127.0.0.1:<port>", and counts the requests that reach it.
func openControl(t *testing.T, e *env) (base string, hits *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(Options{Store: e.store, File: e.file.Load, Apply: e.gw.Reload, State: e.gw.State,
		Listen: ln.Addr().String(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hits = &atomic.Int64{}
	h := srv.Handler()
	hs := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/v1/orgs" && r.Method == "POST" {
			hits.Add(1)
		}
		h.ServeHTTP(w, r)
	})}}
	hs.Start()
	t.Cleanup(hs.Close)
	return hs.URL, hits
}

// orgNames lists the names of the store's orgs, sorted.
func orgNames(t *testing.T, e *env) []string {
	t.Helper()
	var orgs list[orgView]
	e.su("GET", "/api/v1/orgs", nil).json(t, &orgs)
	var names []string
	for _, o := range orgs.Data {
		if o.ID != fileOrg {
			names = append(names, o.Name)
		}
	}
	sort.Strings(names)
	return names
}

// TestControlCrossOrigin: a page of another origin cannot write to an open control plane - neither a form
// nor a text/plain fetch (the requests that need no CORS preflight) - and a request for a name that is not
// the control plane's (DNS rebinding) is refused; the control plane's own clients still write.
func TestControlCrossOrigin(t *testing.T) {
	e := newEnv(t, "")
	base, _ := openControl(t, e)
	host := strings.TrimPrefix(base, "http://")
	evil := "http://evil.example:" + host[strings.LastIndex(host, ":")+1:]
	f := func(hostHdr, ctype, body string, status int, hdr ...string) {
		t.Helper()
		req, err := http.NewRequest("POST", base+"/api/v1/orgs", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if hostHdr != "" {
			req.Host = hostHdr
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Fatalf("POST host %q, %s %q, %q: status %d, want %d: %s", hostHdr, ctype, body, hdr, resp.StatusCode, status, b)
		}
	}
	// A form: what a browser sends from the attacker's page.
	f("", "application/x-www-form-urlencoded", `{"name":"evil-form"}`, 403, "Origin", evil)
	f("", "application/x-www-form-urlencoded", `{"name":"evil-form"}`, 415)
	f("", "text/plain;charset=UTF-8", `{"name":"evil"}`, 403, "Origin", evil, "Sec-Fetch-Site", "cross-site")
	f("", "text/plain", `{"name":"evil"}`, 415)
	f("", "multipart/form-data; boundary=x", "--x--\r\n", 415)
	f("", "", `{"name":"evil"}`, 415)
	f("", "application/json", `{"name":"evil"}`, 403, "Origin", "null")
	f("", "application/json", `{"name":"evil"}`, 403, "Sec-Fetch-Site", "same-site")
	f("", "application/json", `{"name":"evil"}`, 403, "Origin", "http://127.0.0.1:1")
	// DNS rebinding: the attacker's name now resolves to the gateway, and its page is same-origin with it.
	f("evil.example", "application/json", `{"name":"evil"}`, 421)
	f(strings.TrimPrefix(evil, "http://"), "application/json", `{"name":"evil"}`, 421, "Origin", evil)
	f("127.0.0.1:1", "application/json", `{"name":"evil"}`, 421)
	if names := orgNames(t, e); len(names) != 0 {
		t.Fatalf("the attacks created orgs %q", names)
	}
	// The control plane's own clients: curl, the dashboard (same origin), localhost for 127.0.0.1.
	f("", "application/json", `{"name":"own-curl"}`, 201)
	f("", "application/json; charset=utf-8", `{"name":"own-page"}`, 201, "Origin", base, "Sec-Fetch-Site", "same-origin")
	f("localhost"+host[strings.LastIndex(host, ":"):], "application/json", `{"name":"own-localhost"}`, 201)
	if names := orgNames(t, e); strings.Join(names, ",") != "own-curl,own-localhost,own-page" {
		t.Fatalf("orgs %q, want the three the control plane's own clients made", names)
	}
}

// TestControlHosts: the names a control plane answers to, by its listen address and [control] hosts.
func TestControlHosts(t *testing.T) {
	f := func(listen string, hosts []string, host string, want bool) {
		t.Helper()
		if got := newHostSet(listen, hosts).allows(host); got != want {
			t.Fatalf("listen %q, hosts %q: allows(%q) = %v, want %v", listen, hosts, host, got, want)
		}
	}
	f("127.0.0.1:8081", nil, "127.0.0.1:8081", true)
	f("127.0.0.1:8081", nil, "localhost:8081", true)
	f("127.0.0.1:8081", nil, "LOCALHOST:8081", true)
	f("127.0.0.1:8081", nil, "[::1]:8081", true)
	f("127.0.0.1:8081", nil, "localhost:8082", false)
	f("127.0.0.1:8081", nil, "127.0.0.1", false)
	f("127.0.0.1:8081", nil, "evil.example:8081", false)
	f("127.0.0.1:8081", nil, "10.0.0.1:8081", false)
	f("127.0.0.1:8081", nil, "", false)
	f("localhost:8081", nil, "127.0.0.1:8081", true)
	f("[::1]:8081", nil, "[::1]:8081", true)
	f("10.0.0.5:8081", nil, "10.0.0.5:8081", true)
	f("10.0.0.5:8081", nil, "localhost:8081", false)
	f("0.0.0.0:8081", nil, "10.0.0.5:8081", true)
	f("0.0.0.0:8081", nil, "[fd00::1]:8081", true)
	f(":8081", nil, "192.0.2.1:8081", true)
	f(":8081", nil, "gw.internal:8081", false)
	f(":8081", []string{"gw.internal"}, "gw.internal:8081", true)
	f(":8081", []string{"gw.internal"}, "GW.internal", true)
	f(":8081", []string{"gw.internal:443"}, "gw.internal:443", true)
	f(":8081", []string{"gw.internal:443"}, "gw.internal:8081", false)
	f("gw.internal:80", nil, "gw.internal", true)
}
