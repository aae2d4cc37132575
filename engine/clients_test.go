package engine

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

// TestListenerCapWaitsForActive: with every connection busy, a request waits in the backlog and is served
// once a stream ends and its connection goes idle; the budget is given back as connections close.
func TestListenerCapWaitsForActive(t *testing.T) {
	var firstDone atomic.Int64 // unix nanos the upstream finished its first stream
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		sseEvents(20, 20*time.Millisecond)(w, r)
		firstDone.CompareAndSwap(0, time.Now().UnixNano())
	})
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 2\n"))
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}, Timeout: 30 * time.Second}
	defer client.Transport.(*http.Transport).CloseIdleConnections()

	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(gw.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", true)))
			if err != nil {
				t.Errorf("stream: %s", err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}()
	}
	waitFor(t, 10*time.Second, "two streams in flight", func() bool { return up.requests.Load() == 2 })
	quick := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	resp, err := quick.Get(gw.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	served := time.Now().UnixNano()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f := firstDone.Load(); f == 0 || f > served {
		t.Fatalf("a third connection was served while both allowed connections were streaming")
	}
	wg.Wait()
	client.Transport.(*http.Transport).CloseIdleConnections()
	waitFor(t, 5*time.Second, "client connections released", func() bool {
		return gw.g.clients.Stats().Open == 0 && gw.g.conns.InUse() == 0
	})
}

// TestListenerGoroutines: after the listener closes and its connections are gone, no goroutine is left.
func TestListenerGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	up := newFakeUpstream(t, okJSON)
	// A short read timeout: fasthttp's drain waits 5 s for connections that never sent a byte otherwise.
	cfg, err := config.Parse([]byte(withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 4\nread_timeout_secs = 0.3\n")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: testLogger(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	g.server.MaxIdleWorkerDuration = 100 * time.Millisecond
	ln := mustListen(t)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for i := 0; i < 3; i++ {
		resp, err := client.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", "x", false)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var idle []net.Conn
	for i := 0; i < 10; i++ { // over max_conns: some reclaimed, some held or in the backlog at shutdown
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	for _, c := range idle {
		c.Close()
	}
	tr.CloseIdleConnections()
	up.srv.Close()
	waitFor(t, 10*time.Second, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= before })
	if n := g.clients.Stats().Open; n != 0 {
		t.Fatalf("%d client connections still counted", n)
	}
}

// TestListenerChild is the gateway process of TestListenerEMFILE and TestListenerIdleFlood. It sets its
// open-file limit (soft and hard, so that New cannot raise it), serves a gateway over a fake upstream, prints
// "addr <host:port>", obeys "hog" (open files until EMFILE) and "release" on stdin, and drains on SIGTERM.
func TestListenerChild(t *testing.T) {
	v := os.Getenv(childEnv)
	if v == "" {
		t.Skip("the child process of TestListenerEMFILE and TestListenerIdleFlood")
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	var rl syscall.Rlimit
	if _, err := fmt.Sscan(v, &rl.Cur); err != nil { // Rlimit's fields are int64 on the BSDs
		t.Fatal(err)
	}
	rl.Max = rl.Cur
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	up := newFakeUpstream(t, okJSON)
	cfg, err := config.Parse([]byte(gatewayConfig("round_robin", "", up.URL)), "child.toml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln := mustListen(t)
	served := make(chan error, 1)
	go func() { served <- g.Serve(ln) }()
	fmt.Printf("addr %s\n", ln.Addr())

	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	var hog []*os.File
	drain := 10 * time.Second
	for {
		select {
		case cmd, ok := <-cmds:
			if !ok { // the parent is gone: stop at once
				cmds, drain = nil, 0
				select {
				case sig <- syscall.SIGTERM:
				default:
				}
				continue
			}
			switch cmd {
			case "hog":
				for {
					f, err := os.Open(os.DevNull)
					if err != nil {
						break
					}
					hog = append(hog, f)
				}
				fmt.Printf("hogged %d\n", len(hog))
			case "release":
				for _, f := range hog {
					f.Close()
				}
				hog = nil
				fmt.Println("released")
			}
		case err := <-served: // as cmd/rolter, the process ends when Serve does
			t.Fatalf("serve stopped without a signal: %v", err)
		case <-sig:
			ctx, cancel := context.WithTimeout(context.Background(), drain)
			err := g.Shutdown(ctx)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			fmt.Println("drained")
			return
		}
	}
}

type gatewayChild struct {
	cmd    *exec.Cmd
	addr   string
	stdin  io.WriteCloser
	lines  chan string
	stderr syncbuf.Buffer
	exited chan struct{}
	err    error // after exited
}

func startChild(t *testing.T, nofile int) *gatewayChild {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("counts descriptors in /proc")
	}
	c := &gatewayChild{lines: make(chan string, 16), exited: make(chan struct{})}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestListenerChild$", "-test.timeout=60s")
	c.cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(nofile))
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		if t.Failed() {
			t.Logf("child stderr:\n%s", c.stderr.String())
		}
	})
	c.addr = strings.TrimPrefix(c.expect(t, "addr ", 30*time.Second), "addr ")
	return c
}

// expect returns the child's next stdout line starting with prefix, skipping others.
func (c *gatewayChild) expect(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				t.Fatalf("child exited before printing %q: %v", prefix, c.wait())
			}
			if strings.HasPrefix(line, prefix) {
				return line
			}
		case <-deadline:
			t.Fatalf("child printed no %q in %s", prefix, d)
		}
	}
}

func (c *gatewayChild) wait() error {
	<-c.exited
	return c.err
}

func (c *gatewayChild) alive() bool {
	select {
	case <-c.exited:
		return false
	default:
		return c.cmd.Process.Signal(syscall.Signal(0)) == nil
	}
}

func (c *gatewayChild) send(t *testing.T, cmd string) {
	t.Helper()
	if _, err := fmt.Fprintln(c.stdin, cmd); err != nil {
		t.Fatal(err)
	}
}

// stop sends SIGTERM and wants the child to drain and exit 0 within d.
func (c *gatewayChild) stop(t *testing.T, d time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "drained", d)
	select {
	case <-c.exited:
	case <-time.After(d):
		t.Fatalf("child did not exit within %s of SIGTERM", d)
	}
	if c.err != nil {
		t.Fatalf("child exited with %v", c.err)
	}
	t.Logf("drained and exited %s after SIGTERM", time.Since(start).Round(time.Millisecond))
}

func (c *gatewayChild) openFDs() int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", c.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	return len(es)
}

// freshPost sends a chat request on a new connection and returns the status (0 on a transport error).
func freshPost(url string, timeout time.Duration) (int, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: timeout}
	resp, err := client.Post(url, "application/json", strings.NewReader(chatBody("m", "hello", false)))
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// dialMany opens n connections to addr that send nothing; they close at cleanup.
func dialMany(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					errs <- err
					return
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	select {
	case err := <-errs:
		t.Fatalf("cannot open idle connections: %s", err)
	default:
	}
	return conns
}

func needFDs(t *testing.T, n uint64) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || uint64(rl.Cur) < n {
		t.Skipf("needs an open-file limit of %d (have %d)", n, rl.Cur)
	}
}

// TestListenerEMFILE: a gateway out of file descriptors keeps running (accept4 failing with EMFILE is
// retried), and serves the connections that waited once descriptors are free again.
func TestListenerEMFILE(t *testing.T) {
	needFDs(t, 1024)
	c := startChild(t, 128)
	url := "http://" + c.addr + "/v1/chat/completions"
	if status, err := freshPost(url, 10*time.Second); status != 200 {
		t.Fatalf("before: status %d, %v", status, err)
	}
	c.send(t, "hog")
	t.Log(c.expect(t, "hogged", 10*time.Second))

	_ = dialMany(t, c.addr, 200) // more than the child's whole limit
	res := make(chan error, 1)
	go func() {
		status, err := freshPost(url, 30*time.Second)
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d", status)
		}
		res <- err
	}()
	waitFor(t, 10*time.Second, "the child to log failing accepts", func() bool {
		return strings.Contains(c.stderr.String(), "cannot accept connections") && strings.Contains(c.stderr.String(), "too many open files")
	})
	time.Sleep(200 * time.Millisecond) // a few more failed accepts
	if !c.alive() {
		t.Fatalf("the gateway exited on EMFILE: %v", c.wait())
	}
	c.send(t, "release")
	c.expect(t, "released", 10*time.Second)
	select {
	case err := <-res:
		if err != nil {
			t.Fatalf("the request that waited through EMFILE: %s", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the request that waited through EMFILE was not answered")
	}
	if status, err := freshPost(url, 10*time.Second); status != 200 {
		t.Fatalf("after: status %d, %v", status, err)
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}).Get("http://" + c.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := metricValue(string(m), "rolter_accept_errors_total"); n < 1 {
		t.Fatalf("rolter_accept_errors_total = %v after EMFILE", n)
	}
	c.stop(t, 15*time.Second)
}

func metricValue(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}

// TestListenerIdleFlood: 2,000 idle connections at ulimit -n 256 leave the gateway
// serving (fresh requests get in, the descriptor count stays under the limit) and draining normally.
func TestListenerIdleFlood(t *testing.T) {
	const limit, flood = 256, 2000
	needFDs(t, flood+256)
	c := startChild(t, limit)
	var maxFDs atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := int64(c.openFDs()); n > maxFDs.Load() {
				maxFDs.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()

	start := time.Now()
	_ = dialMany(t, c.addr, flood)
	t.Logf("%d idle connections open in %s", flood, time.Since(start).Round(time.Millisecond))
	url := "http://" + c.addr + "/v1/chat/completions"
	var slowest, first time.Duration
	for i := 0; i < 20; i++ {
		s := time.Now()
		status, err := freshPost(url, 15*time.Second)
		if status != 200 {
			t.Fatalf("request %d with %d idle connections open: status %d, %v", i, flood, status, err)
		}
		d := time.Since(s)
		if i == 0 {
			first = d
		} else {
			slowest = max(slowest, d)
		}
	}
	t.Logf("20 requests served: the first in %s, the others in at most %s", first.Round(time.Millisecond), slowest.Round(time.Millisecond))
	close(stop)
	<-sampled
	if n := maxFDs.Load(); n >= limit || n <= 0 {
		t.Fatalf("the child held %d descriptors at most; limit %d", n, limit)
	} else {
		t.Logf("at most %d descriptors open (limit %d)", n, limit)
	}
	if !strings.Contains(c.stderr.String(), "max_conns=96") {
		t.Fatalf("the start log does not show max_conns=96 for a limit of 256")
	}
	c.stop(t, 15*time.Second)
}

// TestLingeringClose: a client still writing headers past max_header_bytes gets its 431 and then the end of
// the connection, not a reset, however long it keeps writing; the connection keeps its place until the client
// closes, or until the linger runs out for a client that neither closes nor sends. A request read whole and
// answered with Connection: close does not linger.
func TestLingeringClose(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_header_bytes = 4096\n"), Options{Linger: 300 * time.Millisecond})
	huge := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Huge: " + strings.Repeat("h", 8000)

	// A gateway that would linger long: the plain close must not wait for it.
	gwLong := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{Linger: time.Minute})
	plain := dial(t, gwLong.addr)
	body := chatBody("m", "hi", false)
	fmt.Fprintf(plain, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(plain); err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 200 ")) {
		t.Fatalf("Connection: close answer: %q, %v", got, err)
	}
	waitFor(t, 5*time.Second, "a whole request answered with Connection: close to close without lingering", func() bool { return gwLong.g.clients.Stats().Open == 0 })

	// The gateway answers once max_header_bytes are read and closes with the rest unread; without a
	// lingering close the kernel resets the connection, and the writes that follow fail.
	c := dial(t, gw.addr)
	if got := writeOnThenRead(t, c, huge, 4); !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) || !bytes.Contains(got, []byte(`"code":"header_too_large"`)) {
		t.Fatalf("answer: %q", got)
	}
	waitFor(t, 5*time.Second, "the client connection to be open while the client writes", func() bool { return gw.g.clients.Stats().Open == 1 })
	c.Close()
	waitFor(t, 5*time.Second, "the connection to close after the client did", func() bool { return gw.g.clients.Stats().Open == 0 })

	// A body announced over max_body_bytes is refused from the headers, before any of it was sent: nothing
	// waits unread when the gateway closes, and the client's body must still not meet a reset.
	c4 := dial(t, gw.addr)
	head := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 100<<20)
	if got := writeOnThenRead(t, c4, head, 3); !bytes.HasPrefix(got, []byte("HTTP/1.1 413 ")) {
		t.Fatalf("answer to an announced over-long body: %q", got)
	}
	c4.Close()
	waitFor(t, 5*time.Second, "the refused client's connection to close", func() bool { return gw.g.clients.Stats().Open == 0 })

	// A client that sends nothing more and never closes is let go after the linger.
	c2 := dial(t, gw.addr)
	if _, err := io.WriteString(c2, huge); err != nil {
		t.Fatal(err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c2); err != nil || !bytes.HasPrefix(got, []byte("HTTP/1.1 431 ")) {
		t.Fatalf("answer: %q, %v", got, err)
	}
	waitFor(t, 5*time.Second, "the connection of a silent client to close", func() bool { return gw.g.clients.Stats().Open == 0 })

	// A client that keeps sending is let go after lingerRounds gaps in all.
	c3 := dial(t, gw.addr)
	if _, err := io.WriteString(c3, huge); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var werr error
	for time.Since(start) < 10*time.Second && werr == nil {
		time.Sleep(50 * time.Millisecond)
		_, werr = io.WriteString(c3, "hhhh")
	}
	if werr == nil {
		t.Fatal("the gateway still reads a client that kept writing after 10 s")
	}
	waitFor(t, 5*time.Second, "the connection of a writing client to close", func() bool { return gw.g.clients.Stats().Open == 0 })
}

// TestServerConcurrencyCoversMaxConns: fasthttp refuses connections over its Concurrency (256k by default)
// with a plain-text 503; the listener's max_conns is the cap, so the server's must not be lower.
func TestServerConcurrencyCoversMaxConns(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGateway(t, withServer(gatewayConfig("round_robin", "", up.URL), "max_conns = 300000\n"))
	if got := gw.g.server.Concurrency; got < 300000 {
		t.Fatalf("fasthttp Concurrency %d under max_conns 300000", got)
	}
}

// keepAliveClient is a client connection sending one request after another and reading each answer.
type keepAliveClient struct {
	c  net.Conn
	br *bufio.Reader
}

func (k *keepAliveClient) exchange(t *testing.T, req string) string {
	t.Helper()
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, req); err != nil {
		t.Fatalf("writing the request: %s", err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatalf("reading the answer: %s", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("answer %d %q, %v", resp.StatusCode, b, err)
	}
	return string(b)
}

func chatRequest() string {
	body := chatBody("m", "hi", false)
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// TestIdleConnsPark: fasthttp keeps a connection's max_header_bytes read buffer between requests when it
// streams request bodies. Parked keep-alive connections give it back, and their request context: 200 of
// them, one request served on each, hold a few KiB of heap each, a fraction of what they held unparked (64
// KiB and more). Each then serves its next request and parks again; shutdown closes parked connections and
// leaves no goroutine behind. (The gateway's janitor parks connections idle for Options.ParkAfter; here the
// test parks them.)
func TestIdleConnsPark(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	l := gw.g.clients
	req := chatRequest()
	const n = 200
	warmUp(t, gw, req)
	before, stackBefore := heapInUse(), stackInUse()
	clients := make([]*keepAliveClient, n)
	for i := range clients {
		clients[i] = newKeepAliveClient(t, gw.addr, 512)
		clients[i].exchange(t, req)
	}
	parkAll := func(what string) {
		waitFor(t, 10*time.Second, what, func() bool {
			l.ParkIdle(time.Now().Add(2 * time.Hour))
			return l.Stats().Parked == n
		})
	}
	runtime.GC()
	held, heldStack := (heapInUse()-before)/n, (stackInUse()-stackBefore)/n
	parkAll("every idle connection to be parked")
	runtime.GC()
	parked, parkedStack := (heapInUse()-before)/n, (stackInUse()-stackBefore)/n
	t.Logf("per idle keep-alive connection, client side included: %d bytes of heap and %d of stacks, %d and %d once parked",
		held, heldStack, parked, parkedStack)
	if parked > 16<<10 || held-parked < 32<<10 {
		t.Fatalf("heap per idle connection: %d bytes, %d parked: fasthttp's buffers were kept", held, parked)
	}

	for _, k := range clients {
		k.exchange(t, req)
	}
	parkAll("every connection to be parked again")
	if got := l.Stats().Parks; got != 2*n {
		t.Fatalf("%d parks, want %d", got, 2*n)
	}
	if _, text := getMetrics(t, gw); metricValue(text, "rolter_client_connections_parked") != n {
		t.Fatalf("rolter_client_connections_parked %v, want %d", metricValue(text, "rolter_client_connections_parked"), n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := gw.g.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for i, k := range clients {
		k.closed(t, 5*time.Second, fmt.Sprintf("connection %d after shutdown", i))
	}
	if got := l.Stats().Open; got != 0 {
		t.Fatalf("%d client connections open after shutdown", got)
	}
	if s := goroutines(); strings.Contains(s, "(*clientConn).park") {
		t.Fatalf("a park goroutine outlived shutdown:\n%s", s)
	}
}

// warmUp serves req on a connection of its own and closes it, so that the server's pools and lazily made
// state exist before a test measures the heap per connection, and collects garbage once (pooled objects
// survive one collection; heapInUse makes the second).
func warmUp(t *testing.T, gw *testGateway, req string) {
	t.Helper()
	warm := newKeepAliveClient(t, gw.addr, 512)
	warm.exchange(t, req)
	warm.c.Close()
	waitFor(t, 5*time.Second, "the warm-up connection to close", func() bool { return gw.g.clients.Stats().Open == 0 })
	runtime.GC()
}

func stackInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.StackInuse)
}

func goroutines() string {
	buf := make([]byte, 1<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// parkedClient starts a gateway (with serverLines in [server]) that parks connections idle for 100 ms, and
// returns it with a client whose connection has served one request and is parked.
func parkedClient(t *testing.T, serverLines string) (*testGateway, *keepAliveClient) {
	t.Helper()
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, withServer(gatewayConfig("round_robin", "", up.URL), serverLines), Options{ParkAfter: 100 * time.Millisecond})
	k := newKeepAliveClient(t, gw.addr, 4096)
	k.exchange(t, chatRequest())
	waitFor(t, 5*time.Second, "the connection to be parked", func() bool { return gw.g.clients.Stats().Parked == 1 })
	return gw, k
}

func newKeepAliveClient(t *testing.T, addr string, bufSize int) *keepAliveClient {
	c := dial(t, addr)
	return &keepAliveClient{c: c, br: bufio.NewReaderSize(c, bufSize)}
}

// closed fails the test unless the gateway ends k's connection within d.
func (k *keepAliveClient) closed(t *testing.T, d time.Duration, what string) {
	t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(d))
	if b, err := k.br.ReadByte(); err != io.EOF {
		t.Fatalf("%s: %q, %v; want the end of the connection", what, b, err)
	}
}

// TestParkedConnIdleTimeout: the janitor parks a connection idle for Options.ParkAfter, and a parked
// connection is closed at idle_timeout_secs, as an unparked one is.
func TestParkedConnIdleTimeout(t *testing.T) {
	gw, k := parkedClient(t, "idle_timeout_secs = 1\n")
	k.closed(t, 10*time.Second, "a parked connection past the idle timeout")
	waitFor(t, 5*time.Second, "the connection to be released", func() bool { return gw.g.clients.Stats().Open == 0 })
}

// TestParkedConnReclaimed: at max_conns a parked connection is reclaimed for a newcomer like any idle one.
func TestParkedConnReclaimed(t *testing.T) {
	gw, k := parkedClient(t, "max_conns = 1\n")
	newKeepAliveClient(t, gw.addr, 4096).exchange(t, chatRequest())
	k.closed(t, 5*time.Second, "the parked connection at max_conns")
	if got := gw.g.clients.Stats().Reclaimed; got != 1 {
		t.Fatalf("%d reclaimed, want 1", got)
	}
	// The scrape's connection reclaims the newcomer's in turn, parked or not.
	if _, text := getMetrics(t, gw); metricValue(text, "rolter_client_connections_parked") != 0 {
		t.Fatalf("rolter_client_connections_parked %v after the parked connections were reclaimed", metricValue(text, "rolter_client_connections_parked"))
	}
}

// TestParkRaces: clients whose requests come around the park delay - some just before the janitor wakes
// their connection, some just after, some two pipelined at once - are all answered, in order, on their own
// connection.
func TestParkRaces(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: 5 * time.Millisecond})
	req := chatRequest()
	const clients = 32
	deadline := time.Now().Add(2 * time.Second)
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		go func(i int) {
			c, err := net.Dial("tcp", gw.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			for j := 0; time.Now().Before(deadline); j++ {
				time.Sleep(time.Duration((i*7+j*13)%12) * time.Millisecond)
				n := 1 + (i+j)%3/2 // every third exchange pipelines two requests
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.WriteString(c, strings.Repeat(req, n)); err != nil {
					errs <- fmt.Errorf("client %d exchange %d: write: %w", i, j, err)
					return
				}
				for k := 0; k < n; k++ {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						errs <- fmt.Errorf("client %d exchange %d answer %d: %w", i, j, k, err)
						return
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || !strings.Contains(string(b), "chat.completion") {
						errs <- fmt.Errorf("client %d exchange %d answer %d: %d %q %v", i, j, k, resp.StatusCode, b, err)
						return
					}
				}
			}
			errs <- nil
		}(i)
	}
	for i := 0; i < clients; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if gw.g.clients.Stats().Parks == 0 {
		t.Fatal("no connection was parked")
	}
	t.Logf("%d parks", gw.g.clients.Stats().Parks)
}

// TestSlowHeadsHoldNoReadBuffer: a connection whose request head arrives slowly holds what it has received,
// not fasthttp's max_header_bytes read buffer: 200 fresh connections that each sent the start of a head
// hold a few hundred bytes of heap each (64 KiB and more each when the server reads heads as they come).
// Each then sends the rest of its head and is answered; so is a head sent a byte at a time.
func TestSlowHeadsHoldNoReadBuffer(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	l := gw.g.clients
	req := chatRequest()
	cut := strings.Index(req, "Content-Type")
	const n = 200
	warmUp(t, gw, req)
	before := heapInUse()
	clients := make([]*keepAliveClient, n)
	for i := range clients {
		clients[i] = newKeepAliveClient(t, gw.addr, 512)
		if _, err := io.WriteString(clients[i].c, req[:cut]); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 5*time.Second, "every connection to be admitted", func() bool { return l.Stats().Open == n })
	time.Sleep(300 * time.Millisecond) // nothing says when the gateway has read what was sent
	held := (heapInUse() - before) / n
	t.Logf("per connection with half a request head sent, client side included: %d bytes of heap", held)
	if held > 8<<10 {
		t.Fatalf("heap per connection with half a head: %d bytes: the read buffer was taken", held)
	}
	for _, k := range clients {
		if got := k.exchange(t, req[cut:]); !strings.Contains(got, "chat.completion") {
			t.Fatalf("answer %q", got)
		}
	}

	k := newKeepAliveClient(t, gw.addr, 512)
	for i := 0; i < len(req)-1; i++ {
		if _, err := io.WriteString(k.c, req[i:i+1]); err != nil {
			t.Fatal(err)
		}
		if i < cut+10 {
			time.Sleep(time.Millisecond)
		}
	}
	if got := k.exchange(t, req[len(req)-1:]); !strings.Contains(got, "chat.completion") {
		t.Fatalf("head sent a byte at a time: %q", got)
	}
}

// TestBareLFHeads: a request head whose lines end in a bare LF is answered 400 at once, where fasthttp alone
// waits for a CRLF CRLF until read_timeout_secs (60 s here): on a fresh connection, on a keep-alive one after
// a request, on a parked one, and when its empty line comes in a later read. The connection is closed after
// the answer.
func TestBareLFHeads(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	parking := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: 5 * time.Millisecond})
	body := chatBody("m", "hi", false)
	for _, head := range []string{
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Type: application/json\nContent-Length: %d\n\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\nContent-Length: %d\n\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\n",
		"POST /v1/chat/completions HTTP/1.1\nHost: x\nContent-Length: %d\n\r\n",
		"GET /health HTTP/1.1\nHost: x\n\n",
	} {
		req := head
		if strings.Contains(head, "%d") {
			req = fmt.Sprintf(head, len(body)) + body
		}
		for _, how := range []string{"fresh", "after a request", "split", "split after a request", "parked"} {
			addr := gw.addr
			if how == "parked" {
				addr = parking.addr
			}
			k := newKeepAliveClient(t, addr, 512)
			if how != "fresh" && how != "split" {
				k.exchange(t, chatRequest())
			}
			if how == "parked" {
				waitFor(t, 5*time.Second, "the connection to park", func() bool { return parking.g.clients.Stats().Parked == 1 })
			}
			_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
			sent := req
			if strings.HasPrefix(how, "split") { // the head's last line end comes 50 ms after the rest
				cut := strings.LastIndex(head, "\n")
				if _, err := io.WriteString(k.c, req[:cut]); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond)
				sent = req[cut:]
			}
			if _, err := io.WriteString(k.c, sent); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(k.br, nil)
			if err != nil {
				t.Fatalf("%q, %s: %v (no answer before the client's 5 s deadline)", head, how, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 400 || !strings.Contains(string(b), "bare LF") {
				t.Fatalf("%q, %s: answer %d %q, %v", head, how, resp.StatusCode, b, err)
			}
			k.closed(t, 5*time.Second, fmt.Sprintf("%q, %s", head, how))
			k.c.Close()
		}
	}
}

// TestNotHTTPAnsweredAtOnce: bytes that cannot begin a request line are answered 400 as soon as they come,
// where fasthttp alone waits for an end of line or CRLF CRLF until read_timeout_secs (60 s here): a TLS
// client sent to the plain port fails its handshake at once instead of hanging, and so do such bytes on a
// keep-alive connection. Empty lines before a request are still skipped.
func TestNotHTTPAnsweredAtOnce(t *testing.T) {
	up := newFakeUpstream(t, okJSON)
	gw := startGatewayWith(t, gatewayConfig("round_robin", "", up.URL), Options{ParkAfter: time.Hour})
	tc := tls.Client(dial(t, gw.addr), &tls.Config{InsecureSkipVerify: true})
	_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("TLS handshake with the plain port: %v, want a failure before the client's 5 s deadline", err)
	}
	tc.Close()

	hello := "\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03"
	for _, how := range []string{"fresh", "after a request"} {
		k := newKeepAliveClient(t, gw.addr, 512)
		if how == "after a request" {
			k.exchange(t, chatRequest())
		}
		_ = k.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(k.c, hello); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(k.br, nil)
		if err != nil {
			t.Fatalf("%s: %v (no answer before the client's 5 s deadline)", how, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(b), "request line") {
			t.Fatalf("%s: answer %d %q", how, resp.StatusCode, b)
		}
		k.closed(t, 5*time.Second, how)
		k.c.Close()
	}

	k := newKeepAliveClient(t, gw.addr, 512)
	if got := k.exchange(t, "\r\n"+chatRequest()); !strings.Contains(got, "chat.completion") {
		t.Fatalf("request after an empty line: %q", got)
	}
	if got := k.exchange(t, "\r\n"+chatRequest()); !strings.Contains(got, "chat.completion") {
		t.Fatalf("keep-alive request after an empty line: %q", got)
	}
}

// withServer puts lines at the top of the [server] section of a gatewayConfig.
func withServer(cfg, lines string) string {
	return strings.Replace(cfg, "[server]\n", "[server]\n"+lines, 1)
}

// The child-process tests run a gateway under a low RLIMIT_NOFILE in a re-executed test binary
// (TestListenerChild) and drive it from here.

const childEnv = "ROLTER_LISTENER_CHILD_NOFILE"

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return quietLog()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func mustListen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// writeOnThenRead writes head, then 8000 more bytes n times 100 ms apart - a client still sending after the
// server answered - failing the test if a write fails; then reads to the end of the connection.
func writeOnThenRead(t *testing.T, c net.Conn, head string, n int) []byte {
	t.Helper()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		time.Sleep(100 * time.Millisecond)
		if _, err := io.WriteString(c, strings.Repeat("h", 8000)); err != nil {
			t.Fatalf("write %d after the answer: %s", i, err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer: %s (%q)", err, got)
	}
	return got
}
