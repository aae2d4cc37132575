package engine

// Regression tests for the findings of an adversarial review: each test names the
// finding it pins. They run over real sockets on loopback, with raw-socket clients and deliberately broken
// upstreams where the finding needs one.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// rawUpstream is an upstream that answers with bytes the test writes itself, to misbehave in ways net/http
// will not. serve is called for every request read off a connection; n counts requests from 1.
type rawUpstream struct {
	t     *testing.T
	ln    net.Listener
	URL   string
	reqs  atomic.Int64
	conns atomic.Int64
	serve func(n int64, c net.Conn, req *http.Request, body []byte)

	mu   sync.Mutex
	open []net.Conn
}

func newRawUpstream(t *testing.T, serve func(n int64, c net.Conn, req *http.Request, body []byte)) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{t: t, ln: ln, URL: "http://" + ln.Addr().String(), serve: serve}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			u.mu.Lock()
			u.open = append(u.open, c)
			u.mu.Unlock()
			go u.handle(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		u.mu.Lock()
		for _, c := range u.open {
			c.Close()
		}
		u.mu.Unlock()
	})
	return u
}

func (u *rawUpstream) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		u.serve(u.reqs.Add(1), c, req, body)
	}
}

// jsonAnswer is a complete 200 response whose body names id.
func jsonAnswer(id string) string {
	body := `{"id":"` + id + `","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` + id + `"},"finish_reason":"stop"}]}`
	return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// TestNoCrossClientAnswers pins finding 1: bytes an upstream sends beyond a framed response never reach the
// next client of that connection, and a 101 to a plain POST is a 502 that closes the connection.
func TestNoCrossClientAnswers(t *testing.T) {
	leak := jsonAnswer("LEAK")
	f := func(name string, misbehave func(c net.Conn, id string)) {
		t.Helper()
		up := newRawUpstream(t, func(n int64, c net.Conn, req *http.Request, _ []byte) {
			id := req.Header.Get("X-Request-Id")
			if n == 1 {
				misbehave(c, id)
				return
			}
			io.WriteString(c, jsonAnswer(id))
		})
		gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", up.URL))
		_, first := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "first", false), "X-Request-Id", "first")
		time.Sleep(60 * time.Millisecond) // a late unsolicited answer arrives while the connection idles
		for i := 0; i < 3; i++ {
			id := fmt.Sprintf("next-%d", i)
			resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", id, false), "X-Request-Id", id)
			if strings.Contains(got, "LEAK") || resp.StatusCode != 200 || !strings.Contains(got, `"id":"`+id+`"`) {
				t.Fatalf("%s: request %s got status %d %s (first request got %s)", name, id, resp.StatusCode, got, first)
			}
		}
	}
	f("body longer than its Content-Length", func(c net.Conn, id string) {
		io.WriteString(c, jsonAnswer(id)+leak)
	})
	f("unsolicited response while idle", func(c net.Conn, id string) {
		io.WriteString(c, jsonAnswer(id))
		time.Sleep(20 * time.Millisecond)
		io.WriteString(c, leak)
	})
	f("204 with a body", func(c net.Conn, id string) {
		io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n"+leak)
	})
	f("304 with a body", func(c net.Conn, id string) {
		io.WriteString(c, "HTTP/1.1 304 Not Modified\r\n\r\n"+leak)
	})
	f("101 to a plain POST", func(c net.Conn, id string) {
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"+leak)
	})
	f("103 Early Hints before the answer", func(c net.Conn, id string) {
		io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"+jsonAnswer(id))
	})
}

// TestSwitchingProtocolsIsBadGateway: the 101 itself is answered 502, never relayed.
func TestSwitchingProtocolsIsBadGateway(t *testing.T) {
	up := newRawUpstream(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n")
	})
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", up.URL))
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "upstream_error")
}

// TestResendAfterWriteIsCounted pins finding 6: a request the upstream read whole before closing is resent
// only as a counted retry, capped by retry.max_retries and shown in x-rolter-retries.
func TestResendAfterWriteIsCounted(t *testing.T) {
	var closing atomic.Bool
	var afterWarmup atomic.Int64
	serve := func(_ int64, c net.Conn, req *http.Request, _ []byte) {
		if closing.Load() {
			afterWarmup.Add(1)
			c.Close() // read it all, answer nothing
			return
		}
		io.WriteString(c, jsonAnswer(req.Header.Get("X-Request-Id")))
	}
	ups := []*rawUpstream{newRawUpstream(t, serve), newRawUpstream(t, serve), newRawUpstream(t, serve)}
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 2\nbackoff_ms = 1\n", ups[0].URL, ups[1].URL, ups[2].URL))
	for i := 0; i < 6; i++ { // every target gets a pooled connection
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "warm", false))
	}
	closing.Store(true)
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 502 {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, got)
	}
	if n := afterWarmup.Load(); n > 3 {
		t.Fatalf("the request reached upstreams %d times, want at most 1 + max_retries = 3", n)
	}
	if r := resp.Header.Get("X-Rolter-Retries"); r != "2" {
		t.Fatalf("x-rolter-retries %q, want 2", r)
	}
}

// TestAnswered500sDoNotEjectTheFleet pins finding 7: requests that make every engine answer 500 do not take
// the fleet out of service, and passive ejection never takes more than max_ejection_percent of it.
func TestAnswered500sDoNotEjectTheFleet(t *testing.T) {
	poison := func(w http.ResponseWriter, r *http.Request) {
		if b, _ := up0Body(r); strings.Contains(b, "poison") {
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"message":"boom","type":"InternalServerError","code":500}}`)
			return
		}
		okJSON(w, r)
	}
	ups := []*fakeUpstream{newFakeUpstream(t, poison), newFakeUpstream(t, poison), newFakeUpstream(t, poison)}
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nbackoff_ms = 1\n[health]\nfail_open = false\n", ups[0].URL, ups[1].URL, ups[2].URL))
	for i := 0; i < 3; i++ {
		if resp, _ := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "poison", false)); resp.StatusCode != 502 {
			t.Fatalf("poison request answered %d, want 502", resp.StatusCode)
		}
	}
	now := time.Now().UnixNano()
	for _, p := range gw.g.Snapshot().Providers {
		if !p.health.eligible(now) {
			t.Fatalf("provider %s was ejected by three requests that made every engine answer 500", p.Name)
		}
	}
	if resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "fine", false)); resp.StatusCode != 200 {
		t.Fatalf("a normal request after the poison ones: %d %s", resp.StatusCode, got)
	}

	// Engines that are really down (503) are ejected - but at most half of the fleet (one of three).
	down := func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }
	for _, u := range ups {
		u.setHandler(down)
	}
	for i := 0; i < 20; i++ {
		post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	}
	ejected := 0
	now = time.Now().UnixNano()
	for _, p := range gw.g.Snapshot().Providers {
		if !p.health.eligible(now) {
			ejected++
		}
	}
	if ejected != 1 {
		t.Fatalf("%d of 3 providers ejected, want 1 (max_ejection_percent = 50, at least one)", ejected)
	}
}

func up0Body(r *http.Request) (string, error) {
	b, err := io.ReadAll(r.Body)
	return string(b), err
}

// TestErrorBodiesReflectNothing pins finding 8: no error body carries request bytes (Authorization, Cookie)
// or upstream internals (addresses, raw upstream bytes, 5xx messages).
func TestErrorBodiesReflectNothing(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		if b, _ := up0Body(r); strings.Contains(b, "five") {
			w.WriteHeader(500)
			io.WriteString(w, `{"error":{"message":"Traceback: /srv/vllm at 10.9.8.7:8000","type":"InternalServerError","code":500}}`)
			return
		}
		w.WriteHeader(502)
		io.WriteString(w, "<html>bad gateway from 10.9.8.7:8000</html>")
	})
	dead := deadAddr(t)
	deadURL := "http://" + dead
	secrets := []string{"sk-SECRET", "COOKIE-SECRET", "10.9.8.7", dead, "Traceback", "html"}
	check := func(what, answer string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(answer, s) {
				t.Fatalf("%s: the answer carries %q: %s", what, s, answer)
			}
		}
	}
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", up.URL))
	for _, raw := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-SECRET\r\nCookie: c=COOKIE-SECRET\r\nContent-Length: abc\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-SECRET\r\nCookie: c=COOKIE-SECRET\r\nTransfer-Encoding: gzip\r\n\r\n",
		"GARBAGE sk-SECRET COOKIE-SECRET\r\n\r\n",
	} {
		c, br := rawRequest(t, gw.addr, raw)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(br)
		check("malformed request", string(b))
	}
	_, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false), "Authorization", "Bearer sk-SECRET")
	check("upstream 502 page", got)
	_, got = post(t, gw.URL+"/v1/chat/completions", chatBody("m", "five", false))
	check("upstream 500 message", got)
	_, got = post(t, gw.URL+"/v1/chat/completions", `{"model":"<img src=sk-SECRET>","messages":[]}`)
	check("unknown model", got)
	gw2 := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", deadURL))
	resp, got := post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 502 {
		t.Fatalf("dead upstream: %d %s", resp.StatusCode, got)
	}
	check("connect failure", got)
}

// readResponse reads one HTTP response off br, skipping interim (1xx) ones as a client must.
func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	for {
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("reading the response: %s", err)
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the body: %s", err)
		}
		return resp, string(b)
	}
}

func rawPost(path, body string, extra ...string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + strings.Join(extra, "") +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// TestHalfClosedClientGetsItsAnswer pins finding 9: a client that shuts down its sending side (`nc -N`)
// still gets its answer, streamed or not, and its generation is not aborted.
func TestHalfClosedClientGetsItsAnswer(t *testing.T) {
	slow := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
		okJSON(w, r)
	}
	up := newFakeUpstream(t, slow)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	c, br := rawRequest(t, gw.addr, rawPost("/v1/chat/completions", chatBody("m", "x", false), "Connection: close\r\n"))
	c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, got := readResponse(t, br, "POST")
	if resp.StatusCode != 200 || !strings.Contains(got, "chat.completion") {
		t.Fatalf("half-closed client got %d %q, want its completion", resp.StatusCode, got)
	}
	select {
	case <-up.gone:
		t.Fatal("the upstream request was cancelled")
	default:
	}

	up.setHandler(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(150 * time.Millisecond)
		sseEvents(5, 20*time.Millisecond)(w, r)
	})
	c, br = rawRequest(t, gw.addr, rawPost("/v1/chat/completions", chatBody("m", "x", true), "Connection: close\r\n"))
	c.(*net.TCPConn).CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, got = readResponse(t, br, "POST")
	if resp.StatusCode != 200 || !strings.Contains(got, "data: [DONE]") || strings.Count(got, "chat.completion.chunk") != 5 {
		t.Fatalf("half-closed streaming client got %d %q", resp.StatusCode, got)
	}
}

// TestDepartedClientNeverSeesSuccess: a client that closes while waiting is noticed and its upstream
// request cancelled, and nothing - least of all a 200 with an empty body - is written back.
func TestDepartedClientNeverSeesSuccess(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
			okJSON(w, r)
		}
	})
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	c, _ := rawRequest(t, gw.addr, rawPost("/v1/chat/completions", chatBody("m", "x", false)))
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case <-up.gone:
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream request outlived its client")
	}
}

// TestClientLeftInQueueIsNotSent pins finding 11: a request whose client left while it waited for a slot is
// never sent upstream.
func TestClientLeftInQueueIsNotSent(t *testing.T) {
	release := make(chan struct{})
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		okJSON(w, r)
	})
	gw := startGateway(t, gatewayConfig("round_robin", "[queue]\nmax_inflight_per_target = 1\nmax_waiting_per_target = 4\nwait_timeout_secs = 10\n", up.URL))
	done := make(chan struct{})
	go func() {
		defer close(done)
		fire(gw.URL+"/v1/chat/completions", chatBody("m", "first", false))
	}()
	waitFor(t, 3*time.Second, "the first request upstream", func() bool { return up.requests.Load() == 1 })
	c, _ := rawRequest(t, gw.addr, rawPost("/v1/chat/completions", chatBody("m", "queued", false)))
	waitFor(t, 3*time.Second, "the second request to queue", func() bool {
		return gw.g.Snapshot().Providers[0].adm.waiting.Load() == 1
	})
	c.Close()
	waitFor(t, 3*time.Second, "the queued request to leave the queue", func() bool {
		return gw.g.Snapshot().Providers[0].adm.waiting.Load() == 0
	})
	close(release)
	<-done
	time.Sleep(100 * time.Millisecond)
	if n := up.requests.Load(); n != 1 {
		t.Fatalf("upstream saw %d requests, want 1: the departed client's request was sent", n)
	}
}

// TestHTTPConformance pins finding 13.
func TestHTTPConformance(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_body_bytes = 4096\n"))
	body := chatBody("m", "x", false)
	status := func(raw string) (int, string, *bufio.Reader) {
		t.Helper()
		c, br := rawRequest(t, gw.addr, raw)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("no status line for %q: %s", raw, err)
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			t.Fatalf("bad status line %q", line)
		}
		n, _ := strconv.Atoi(f[1])
		return n, line, br
	}

	// Headers named in Connection are hop-by-hop: not forwarded.
	if n, line, _ := status(rawPost("/v1/chat/completions", body, "Connection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\nX-Kept: 2\r\n")); n != 200 {
		t.Fatalf("Connection-listed header: %s", line)
	}
	if _, h := up.last(); h.Get("X-Secret-Hop") != "" || h.Get("X-Kept") != "2" {
		t.Fatalf("upstream headers %v: X-Secret-Hop must be dropped, X-Kept kept", h)
	}
	// A header name that is not a token is refused, not forwarded.
	if n, line, _ := status(rawPost("/v1/chat/completions", body, "X Spaced: 1\r\n")); n != 400 {
		t.Fatalf("header name with a space: %s", line)
	}
	// Unknown protocol versions.
	if n, line, _ := status("POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body); n != 505 {
		t.Fatalf("HTTP/9.9: %s", line)
	}
	// Expectations other than 100-continue.
	if n, line, _ := status(rawPost("/v1/chat/completions", body, "Expect: teapot\r\n")); n != 417 {
		t.Fatalf("Expect: teapot: %s", line)
	}
	// An oversized body announced with Expect: 100-continue is refused before it is sent: no 100 first.
	big := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100000\r\n\r\n"
	if n, line, _ := status(big); n != 413 {
		t.Fatalf("oversized body with Expect: 100-continue: first status line %q, want 413", line)
	}
	// A body within the limit with Expect gets its 100 Continue, then the answer.
	c, br := rawRequest(t, gw.addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, _ := br.ReadString('\n'); !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("Expect: 100-continue within the limit: %q", line)
	}
	br.ReadString('\n')
	io.WriteString(c, body)
	if resp, got := readResponse(t, br, "POST"); resp.StatusCode != 200 {
		t.Fatalf("after 100 Continue: %d %s", resp.StatusCode, got)
	}
}

// TestTruncatedAnswerIsBadGateway: a non-streaming answer cut short by the upstream reaches the client as a
// clean 502 with a status line, not as a status line followed by a truncated body - or nothing (finding 13).
func TestTruncatedAnswerIsBadGateway(t *testing.T) {
	up := newRawUpstream(t, func(_ int64, c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":\"cut")
		c.Close()
	})
	gw := startGateway(t, gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n", up.URL))
	c, br := rawRequest(t, gw.addr, rawPost("/v1/chat/completions", chatBody("m", "x", false)))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, got := readResponse(t, br, "POST")
	if resp.StatusCode != 502 {
		t.Fatalf("truncated answer: %d %q", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "upstream_error")
}

// TestRetryAfterReadyzForwardedMetrics pins finding 14.
func TestRetryAfterReadyzForwardedMetrics(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "100000")
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limited"}}`)
	})
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "[retry]\nmax_retries = 0\n[cooldown]\nfailures = 1\n", up.URL), "expose_metrics = false\n"))
	resp, got := post(t, gw.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if resp.StatusCode != 429 {
		t.Fatalf("status %d: %s", resp.StatusCode, got)
	}
	if ra, _ := strconv.Atoi(resp.Header.Get("Retry-After")); ra < 1 || ra > 60 {
		t.Fatalf("Retry-After %q relayed, want at most cooldown.max_retry_after_secs (60)", resp.Header.Get("Retry-After"))
	}
	// Every target is cooling now: the gateway is not ready.
	r, err := testClient.Get(gw.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 503 {
		t.Fatalf("/readyz %d with every target cooling, want 503", r.StatusCode)
	}
	if r, err = testClient.Get(gw.URL + "/metrics"); err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 404 {
		t.Fatalf("/metrics %d with expose_metrics = false, want 404", r.StatusCode)
	}

	up.setHandler(okJSON)
	gw2 := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "x", false), "X-Forwarded-For", "203.0.113.9")
	if _, h := up.last(); h.Get("X-Forwarded-For") != "203.0.113.9, 127.0.0.1" {
		t.Fatalf("X-Forwarded-For %q, want the client address appended", h.Get("X-Forwarded-For"))
	}
	post(t, gw2.URL+"/v1/chat/completions", chatBody("m", "x", false))
	if _, h := up.last(); h.Get("X-Forwarded-For") != "127.0.0.1" {
		t.Fatalf("X-Forwarded-For %q, want the client address", h.Get("X-Forwarded-For"))
	}
}

// TestTrieCeilingsShareTheBudget pins finding 15: the default trie ceilings split
// server.routing_memory_bytes over the cache-aware targets.
func TestTrieCeilingsShareTheBudget(t *testing.T) {
	f := func(extra string, targets, wantNodes, wantBytes int) {
		t.Helper()
		urls := make([]string, targets)
		for i := range urls {
			urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 9000+i)
		}
		cfg, err := config.Parse([]byte(withServer(gatewayConfig("cache_aware", "", urls...), extra)), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		nodes, bytes := cfg.TrieShare()
		if nodes != wantNodes || bytes != wantBytes {
			t.Fatalf("%d targets %q: ceilings %d nodes, %d bytes; want %d, %d", targets, extra, nodes, bytes, wantNodes, wantBytes)
		}
	}
	f("", 8, 524288, 26843545)   // 512 MiB / 8 = 64 MiB: 0.4 of it in bytes, 0.5 of it / 64 in nodes
	f("", 1, 1000000, 214748364) // the node ceiling never passes the documented million
	f("routing_memory_bytes = 67108864\n", 4, 131072, 6710886)
}

// heapInUse returns the live heap after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

// TestAnnouncedBodiesAreNotReserved pins finding 3: connections that announce the largest body and send a
// few bytes hold a few kilobytes each, not the announced size. The bound (docs/deployment/security.md): a request holds
// what it received, rounded up to at most twice that, at least 16 KiB, plus the connection's read buffer
// (server.max_header_bytes) while it is being read.
func TestAnnouncedBodiesAreNotReserved(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	before := heapInUse()
	const conns = 40
	for i := 0; i < conns; i++ {
		c, _ := rawRequest(t, gw.addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16777216\r\n\r\n{\"model\":")
		defer c.Close()
	}
	// The server reads at most 8 KiB ahead before the handler runs; nothing says when that happened.
	time.Sleep(300 * time.Millisecond)
	grew := heapInUse() - before
	t.Logf("%d connections announcing 16 MiB: heap +%d KiB, body memory %d KiB", conns, grew>>10, gw.g.bodyMem.Load()>>10)
	if limit := int64(conns * (16<<10 + 64<<10 + 64<<10)); grew > limit {
		t.Fatalf("heap grew %d bytes for %d idle announced bodies, want under %d", grew, conns, limit)
	}
}

// TestBodyMemoryBudget: requests beyond server.max_body_memory_bytes are answered 503 at once, and the
// budget is given back when they finish.
func TestBodyMemoryBudget(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_body_bytes = 1048576\nmax_body_memory_bytes = 1572864\n"))
	half := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 600<<10) + `"}]}`
	// One request holds most of the budget while its body trickles in.
	c, _ := rawRequest(t, gw.addr, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(half))+"\r\n\r\n"+half[:len(half)-10])
	waitFor(t, 5*time.Second, "the first body to be held", func() bool { return gw.g.bodyMem.Load() >= 512<<10 })
	resp, got := post(t, gw.URL+"/v1/chat/completions", half)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("over the body memory: %d %s", resp.StatusCode, got)
	}
	assertOpenAIError(t, got, "server_busy")
	io.WriteString(c, half[len(half)-10:])
	waitFor(t, 5*time.Second, "the body memory to be given back", func() bool { return gw.g.bodyMem.Load() == 0 })
	if resp, got := post(t, gw.URL+"/v1/chat/completions", half); resp.StatusCode != 200 {
		t.Fatalf("after the budget came back: %d %s", resp.StatusCode, got)
	}
}

// TestJSONAsTheEngineReadsIt pins finding 12 end to end: what the gateway accepts, refuses and rewrites is
// what vLLM's parser (Python's json) reads.
func TestJSONAsTheEngineReadsIt(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, gatewayConfig("round_robin", "", up.URL))
	f := func(body string, wantStatus int, wantUpstream string) {
		t.Helper()
		resp, got := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != wantStatus {
			t.Fatalf("%s: status %d, want %d: %s", body, resp.StatusCode, wantStatus, got)
		}
		if wantUpstream != "" {
			if b, _ := up.last(); b != wantUpstream {
				t.Fatalf("%s: upstream got %s, want %s", body, b, wantUpstream)
			}
		}
	}
	f(`{"model":"m","temperature":NaN,"messages":[]}`, 200, `{"model":"up-model","temperature":NaN,"messages":[]}`)
	f(`{"model":"m","top_p":-Infinity,"messages":[]}`, 200, `{"model":"up-model","top_p":-Infinity,"messages":[]}`)
	f(`{"m\u006fdel":"m","messages":[]}`, 200, `{"m\u006fdel":"up-model","messages":[]}`)
	f(`{"model":"m","temperature":nan,"messages":[]}`, 400, "")
	f("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\tb\"}]}", 400, "")
	f(`{"model":"m","messages":[{"role":"user","content":"\x41"}]}`, 400, "")
	f(`{"\x6dodel":"m","model":"m","messages":[]}`, 400, "")
	f(`{"model":"m","model":"m","messages":[]}`, 400, "")
	f("{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", 400, "")
}

// TestDenseBodiesStayBounded pins finding 2: bodies of many small JSON values cost memory in proportion to
// their size, not to their value count (the earlier parser built a node per value: about 230x the body).
func TestDenseBodiesStayBounded(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	const size = 4 << 20
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_body_bytes = "+strconv.Itoa(size)+"\n"))
	prefix := `{"model":"m","messages":[{"role":"user","content":"hi"}],"logit_bias":[`
	var b strings.Builder
	b.WriteString(prefix)
	for b.Len() < size-16 {
		b.WriteString("0,")
	}
	b.WriteString("0]}")
	body := b.String()
	before := heapInUse()
	var peak, held atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			runtime.ReadMemStats(&m)
			if v := int64(m.HeapInuse); v > peak.Load() {
				peak.Store(v)
			}
			if v := gw.g.bodyMem.Load(); v > held.Load() {
				held.Store(v)
			}
		}
	}()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, got := post(t, gw.URL+"/v1/chat/completions", body); resp.StatusCode != 200 {
				t.Errorf("dense body: %d %s", resp.StatusCode, got)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	grew := peak.Load() - before
	t.Logf("8 concurrent %d MiB dense bodies: peak heap +%d MiB (all processes' sides), gateway request memory peak %d MiB",
		size>>20, grew>>20, held.Load()>>20)
	// The gateway's own share: each body once, its prompt key and answer are tiny.
	if limit := int64(8 * (size + 64<<10)); held.Load() > limit {
		t.Fatalf("gateway request memory peaked at %d bytes, want at most %d", held.Load(), limit)
	}
	// Each body is held once by the test's client, once by the gateway, and once by the fake upstream;
	// 8 x 4 MiB x 3 = 96 MiB plus their copies in flight. The earlier parser needed about 7 GiB here.
	if limit := int64(8 * size * 6); grew > limit {
		t.Fatalf("peak heap grew %d MiB, want under %d MiB", grew>>20, limit>>20)
	}
}
