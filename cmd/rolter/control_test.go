package main

import (
	"bufio"
	"errors"
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const controlChildEnv = "ROLTER_CONTROL_CHILD_NOFILE"

// TestControlFloodChild is the gateway process of TestControlFlood: `rolter serve` under the open-file
// limit (soft and hard, so that the gateway cannot raise it) in the environment, on the config in argument
// -config.
func TestControlFloodChild(t *testing.T) {
	v := os.Getenv(controlChildEnv)
	if v == "" {
		t.Skip("the child process of TestControlFlood")
	}
	var rl syscall.Rlimit
	if _, err := fmt.Sscan(v, &rl.Cur); err != nil { // Rlimit's fields are int64 on the BSDs
		t.Fatal(err)
	}
	rl.Max = rl.Cur
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	os.Exit(run([]string{"serve", "-config", os.Getenv("ROLTER_CONTROL_CHILD_CONFIG"), "-log-level", "info"}, os.Stdout, os.Stderr))
}

// TestControlFlood: 300 idle connections to the control plane of a gateway at ulimit -n 256 leave the data
// plane serving as fast as before (the control plane's max_conns is set aside from the socket budget, and
// connections beyond it are closed at once), and the idle ones are closed by the control plane's read and
// idle timeouts.
func TestControlFlood(t *testing.T) {
	const limit, flood, maxConns = 256, 300, 32
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || uint64(rl.Cur) < 2*flood+256 {
		t.Skipf("needs an open-file limit of %d (have %d)", 2*flood+256, rl.Cur)
	}
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(upLn)
	defer up.Close()
	addr, ctl := freeAddr(t), freeAddr(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "serve.toml")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`[server]
listen = %q
drain_secs = 2
[control]
enabled = true
listen = %q
store = %q
admin_token_env = "ROLTER_TEST_ADMIN"
max_conns = %d
read_timeout_secs = 1
idle_timeout_secs = 1
[[providers]]
name = "a"
api_base = "http://%s"
[[routes]]
model = "m"
[[routes.targets]]
provider = "a"
`, addr, ctl, filepath.Join(dir, "rolter.db"), maxConns, upLn.Addr())), 0o600)

	cmd := exec.Command(os.Args[0], "-test.run=^TestControlFloodChild$", "-test.v")
	cmd.Env = append(os.Environ(), controlChildEnv+"="+strconv.Itoa(limit), "ROLTER_CONTROL_CHILD_CONFIG="+cfg, "ROLTER_TEST_ADMIN=root-secret")
	var logs syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("child output:\n%s", logs.String())
		}
	}()

	chat := "http://" + addr + "/v1/chat/completions"
	post := func() (time.Duration, error) {
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
		start := time.Now()
		resp, err := client.Post(chat, "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	for i := 0; ; i++ {
		if _, err := post(); err == nil {
			break
		} else if i == 200 {
			t.Fatalf("the gateway does not serve: %s", err)
		}
		time.Sleep(25 * time.Millisecond)
	}
	median := func(what string) time.Duration {
		t.Helper()
		var ds []time.Duration
		for i := 0; i < 20; i++ {
			d, err := post()
			if err != nil {
				t.Fatalf("%s, request %d: %s", what, i, err)
			}
			ds = append(ds, d)
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	base := median("before the flood")

	// The flood: connections that send nothing, as many as the process may open files and more.
	conns := make([]net.Conn, 0, flood)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < flood; i++ {
		c, err := net.DialTimeout("tcp", ctl, 5*time.Second)
		if err != nil {
			t.Fatalf("cannot open idle connection %d to the control plane: %s", i, err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	during := median(fmt.Sprintf("with %d idle control-plane connections", flood))
	// A 2 ms floor: below it, loopback latency is scheduling noise on a loaded machine.
	if ratio := float64(during) / float64(max(base, 2*time.Millisecond)); ratio > 10 {
		t.Fatalf("data-plane median %s with the flood, %s before: %.1fx", during, base, ratio)
	}
	t.Logf("data-plane median %s before, %s with %d idle control-plane connections", base, during, flood)

	// Every idle connection is closed: those beyond max_conns at once, the others by the read timeout.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []int
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(start.Add(5 * time.Second))
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				mu.Lock()
				open = append(open, i)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(open) > 0 {
		t.Fatalf("%d idle control-plane connections still open after 5 s (read_timeout_secs = 1): %v", len(open), open)
	}

	// A keep-alive connection after its request is closed by the idle timeout.
	c, err := net.Dial("tcp", ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /api/v1/openapi.json HTTP/1.1\r\nHost: %s\r\n\r\n", ctl)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a keep-alive request to the control plane: %v %v", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	idle := time.Now()
	_ = c.SetReadDeadline(idle.Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle keep-alive connection: %v after %s, want it closed (idle_timeout_secs = 1)", err, time.Since(idle))
	}

	m := metricsText(t, addr)
	if n := metricOf(m, "rolter_control_connections_rejected_total"); n < 1 {
		t.Fatalf("rolter_control_connections_rejected_total = %v after %d connections over max_conns %d", n, flood, maxConns)
	}
	if !strings.Contains(logs.String(), "control_conns="+strconv.Itoa(maxConns)) || !strings.Contains(logs.String(), "socket_budget=160") {
		t.Fatalf("the start log does not show the control plane's %d connections out of a socket budget of 160", maxConns)
	}
}

func metricsText(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func metricOf(text, name string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return -1
}
