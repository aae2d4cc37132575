package main

import (
	"encoding/json"
	"fmt"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/control/store/pgtest"
	"github.com/rolter-ai/rolter/internal/freeport"
)

// The fleet test runs `rolter serve` twice, as two processes (the test binary again, in
// TestServeFleetChild), on one PostgreSQL database.

const fleetChildEnv = "ROLTER_FLEET_CHILD"

// TestServeFleetChild is one gateway of TestServeFleetOnPostgres: `rolter serve` with the config file
// $ROLTER_FLEET_CHILD, until SIGTERM or SIGKILL.
func TestServeFleetChild(t *testing.T) {
	cfg := os.Getenv(fleetChildEnv)
	if cfg == "" {
		t.Skip("a child process of TestServeFleetOnPostgres")
	}
	os.Exit(run([]string{"serve", "-config", cfg, "-log-level", "info"}, os.Stdout, os.Stderr))
}

// fleetGateway is one `rolter serve` process of the fleet test.
type fleetGateway struct {
	t        *testing.T
	data     string // the data plane's address
	api      string // the control plane's address
	cmd      *exec.Cmd
	log      *syncbuf.Buffer
	done     chan struct{}
	exitCode int
}

// freeAddr is a loopback address for a gateway the test starts (freeport.Loopback: one another package's
// test server cannot take before the gateway binds it).
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// startGateway starts `rolter serve` on store in a child process and waits until its control plane
// answers; it is killed at cleanup if still running.
func startGateway(t *testing.T, store string) *fleetGateway {
	t.Helper()
	g := &fleetGateway{t: t, data: freeAddr(t), api: freeAddr(t), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	cfg := filepath.Join(t.TempDir(), "rolter.toml")
	text := fmt.Sprintf("[server]\nlisten = %q\ndrain_secs = 2\n[retry]\nmax_retries = 0\n[control]\nenabled = true\nlisten = %q\nstore = %q\nadmin_token_env = \"ROLTER_TEST_ADMIN\"\n", g.data, g.api, store)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	g.cmd = exec.Command(os.Args[0], "-test.run=^TestServeFleetChild$", "-test.timeout=120s")
	g.cmd.Env = append(os.Environ(), fleetChildEnv+"="+cfg, "ROLTER_TEST_ADMIN=root-secret")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = g.cmd.Wait()
		g.exitCode = g.cmd.ProcessState.ExitCode()
		close(g.done)
	}()
	t.Cleanup(func() {
		select {
		case <-g.done:
		default:
			_ = g.cmd.Process.Kill()
			<-g.done
		}
		if t.Failed() {
			t.Logf("gateway %s log:\n%s", g.api, g.log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, _ := g.call("GET", "/api/v1/info", ""); code == 200 {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway %s does not answer after 30s:\n%s", g.api, g.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// call calls the control plane as the superadmin; code 0 is a transport error.
func (g *fleetGateway) call(method, path, body string) (int, string) {
	req, _ := http.NewRequest(method, "http://"+g.api+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer root-secret")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// must calls the control plane and fails the test unless it answers code.
func (g *fleetGateway) must(code int, method, path, body string) string {
	g.t.Helper()
	got, b := g.call(method, path, body)
	if got != code {
		g.t.Fatalf("%s %s: %d %s; want %d", method, path, got, b, code)
	}
	return b
}

// chat sends a chat completion for model with key to the data plane and returns the status.
func (g *fleetGateway) chat(model, key string) int {
	req, _ := http.NewRequest("POST", "http://"+g.data+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitServes waits until g answers model 200 and returns how long after since; it fails after within.
func (g *fleetGateway) waitServes(model, key string, since time.Time, within time.Duration) time.Duration {
	g.t.Helper()
	for {
		if g.chat(model, key) == 200 {
			return time.Since(since)
		}
		if time.Since(since) > within {
			g.t.Fatalf("gateway %s does not serve %s %s after the change", g.data, model, time.Since(since).Round(time.Millisecond))
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestServeFleetOnPostgres: two `rolter serve` processes on one PostgreSQL database. A change through one
// is served by both within a second; the first is killed (SIGKILL) while it accepts a stream of changes,
// and every change it acknowledged is served by the other; the other goes on taking changes, and its
// GET /api/v1/state lists both replicas.
func TestServeFleetOnPostgres(t *testing.T) {
	pg := pgtest.New(t)
	store := pg.NewDatabase(t)
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	})}
	upLn, _ := net.Listen("tcp", "127.0.0.1:0")
	go up.Serve(upLn)
	defer up.Close()
	g1, g2 := startGateway(t, store), startGateway(t, store)

	var org struct{ ID string }
	json.Unmarshal([]byte(g1.must(201, "POST", "/api/v1/orgs", `{"name":"team"}`)), &org)
	base := "/api/v1/orgs/" + org.ID
	g2.must(201, "POST", base+"/providers", `{"name":"p","api_base":"http://`+upLn.Addr().String()+`"}`)
	var key struct{ Secret string }
	json.Unmarshal([]byte(g1.must(201, "POST", base+"/keys", `{"name":"k"}`)), &key)
	var took []string
	for i, via := range []*fleetGateway{g1, g2, g1} {
		model := fmt.Sprint("first-", i)
		via.must(201, "POST", base+"/routes", `{"model":"`+model+`","targets":[{"provider":"p"}]}`)
		answered := time.Now()
		for _, g := range []*fleetGateway{g1, g2} {
			took = append(took, g.waitServes(model, key.Secret, answered, time.Second).Round(100*time.Microsecond).String())
		}
	}
	t.Logf("a change through one process served by both after %s", strings.Join(took, " "))

	// A stream of changes through g1, killed at a random moment of it.
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	killAfter, delay := 5+rng.IntN(15), time.Duration(rng.IntN(15000))*time.Microsecond
	acked := -1
	killed := make(chan struct{})
	go func() {
		defer close(killed)
		for n := 0; ; n++ {
			code, _ := g1.call("POST", base+"/routes", fmt.Sprintf(`{"model":"m%d","targets":[{"provider":"p"}]}`, n))
			if code != 201 {
				return // the kill
			}
			acked = n
			if n == killAfter {
				time.AfterFunc(delay, func() { _ = g1.cmd.Process.Signal(syscall.SIGKILL) })
			}
		}
	}()
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the change stream did not end")
	}
	<-g1.done
	if acked < killAfter {
		t.Fatalf("g1 stopped after ack %d, before the kill after ack %d:\n%s", acked, killAfter, g1.log.String())
	}
	killedAt := time.Now()
	var worst time.Duration
	for n := 0; n <= acked; n++ {
		worst = max(worst, g2.waitServes(fmt.Sprint("m", n), key.Secret, killedAt, time.Second))
	}
	var routes struct{ Data []struct{ Model string } }
	json.Unmarshal([]byte(g2.must(200, "GET", base+"/routes", "")), &routes)
	stored := 0
	for _, r := range routes.Data {
		if strings.HasPrefix(r.Model, "m") {
			stored++
		}
	}
	// The change in flight at the kill may have committed unacknowledged; nothing acknowledged is lost.
	if stored != acked+1 && stored != acked+2 {
		t.Fatalf("%d changes stored after %d acknowledged", stored, acked+1)
	}
	t.Logf("g1 killed %s after ack %d: %d changes acknowledged, %d stored, all served by g2 within %s of the kill",
		delay, killAfter, acked+1, stored, worst.Round(time.Millisecond))

	// The kill left no lock behind: g2 takes changes, and lists both replicas.
	g2.must(201, "POST", base+"/routes", `{"model":"after","targets":[{"provider":"p"}]}`)
	g2.waitServes("after", key.Secret, time.Now(), time.Second)
	var st struct {
		StoreGeneration int64 `json:"store_generation"`
		Replicas        []struct {
			Generation int64
			Self       bool
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		json.Unmarshal([]byte(g2.must(200, "GET", "/api/v1/state", "")), &st)
		self := -1
		for i, r := range st.Replicas {
			if r.Self {
				self = i
			}
		}
		if len(st.Replicas) == 2 && self >= 0 && st.Replicas[self].Generation == st.StoreGeneration {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("state %+v; want 2 replicas, g2 at its store generation", st)
		}
		time.Sleep(20 * time.Millisecond)
	}

	_ = g2.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g2.done:
		if g2.exitCode != 0 {
			t.Fatalf("g2 exited %d:\n%s", g2.exitCode, g2.log.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("g2 did not exit after SIGTERM")
	}
}
