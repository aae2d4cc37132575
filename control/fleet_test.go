package control

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/control/store/pgtest"
)

// The fleet tests run several gateways (each an env: a gateway, its control plane and a Follower) on one
// PostgreSQL database (control/store/pgtest): make test requires it.

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	stopSpec()
	os.Exit(code)
}

// converge is how soon a change answered by one gateway must be served by every gateway.
const converge = time.Second

// follow starts a Follower of e's control plane with the given safety-net check; it stops at cleanup,
// before the store closes.
func (e *env) follow(check time.Duration) *Follower {
	e.t.Helper()
	f := NewFollower(e.srv, FollowerOptions{Address: e.api.base, Check: check, Retry: 200 * time.Millisecond})
	f.Start()
	e.t.Cleanup(f.Stop)
	return f
}

// tryChat is chat that reports a transport error instead of failing the test (for load goroutines).
func (e *env) tryChat(model, key string) (int, string, error) {
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}]}`, model)
	req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get("x-rolter-provider"), nil
}

// waitServes waits until e answers model with status (from provider, when status is 200) and returns how
// long after since that was; it fails the test after within.
func (e *env) waitServes(model, key string, status int, provider string, since time.Time, within time.Duration) time.Duration {
	e.t.Helper()
	for {
		got, p, err := e.tryChat(model, key)
		if err == nil && got == status && (status != 200 || p == provider) {
			return time.Since(since)
		}
		if time.Since(since) > within {
			e.t.Fatalf("%s after the change, gateway %s answers %s with %d from %q (%v); want %d from %q", time.Since(since).Round(time.Millisecond), e.replica, model, got, p, err, status, provider)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// stateOf returns e's GET /api/v1/state.
func (e *env) stateOf() stateView {
	e.t.Helper()
	var st stateView
	r := e.su("GET", "/api/v1/state", nil)
	want(e.t, r, 200, "")
	r.json(e.t, &st)
	return st
}

// waitReplicas waits until e's state lists the replicas ids, every one at e's store generation.
func (e *env) waitReplicas(within time.Duration, ids ...string) stateView {
	e.t.Helper()
	ids = slices.Sorted(slices.Values(ids)) // as the state lists them
	deadline := time.Now().Add(within)
	for {
		st := e.stateOf()
		ok := len(st.Replicas) == len(ids)
		for i := 0; ok && i < len(ids); i++ {
			r := st.Replicas[i]
			ok = r.ID == ids[i] && r.Generation == st.StoreGeneration && r.Self == (r.ID == e.replica) && r.Error == ""
		}
		if ok {
			return st
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("replicas %+v at store generation %d; want %q at it", st.Replicas, st.StoreGeneration, ids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFleetChangeReachesEveryGateway: two gateways on one database; a change through either is served by
// both within a second (notifications alone: the followers' check is longer than the test); a gateway
// that stopped following catches up from the generation as soon as it follows again; GET /api/v1/state
// shows both replicas at the same generation; concurrent PUTs through both gateways lose nothing: without
// If-Match the later one wins whole, with If-Match one wins and the others answer 409.
func TestFleetChangeReachesEveryGateway(t *testing.T) {
	dsn := pgtest.Database(t)
	g1, g2 := newEnvAt(t, dsn), newEnvAt(t, dsn)
	g1.follow(time.Hour)
	f2 := g2.follow(time.Hour)
	a := g1.mkOrg("fleet")
	key := g1.orgKey(a)
	base := "/api/v1/orgs/" + a
	want(t, g1.su("POST", base+"/providers", provider("p", g1.A.URL)), 201, "")
	want(t, g2.su("POST", base+"/providers", provider("q", g1.B.URL)), 201, "")

	var worst time.Duration
	var took []string
	change := func(via *env, method, path string, body any, status int, serves int, provider string) {
		t.Helper()
		want(t, via.su(method, path, body), status, "")
		answered := time.Now()
		for _, g := range []*env{g1, g2} {
			d := g.waitServes("m", key, serves, provider, answered, converge)
			worst = max(worst, d)
			took = append(took, d.Round(100*time.Microsecond).String())
		}
	}
	change(g1, "POST", base+"/routes", route("m", "p"), 201, 200, a+"/p")
	change(g2, "PUT", base+"/routes/m", route("m", "q"), 200, 200, a+"/q")
	change(g1, "PUT", base+"/routes/m", route("m", "p"), 200, 200, a+"/p")
	change(g2, "DELETE", base+"/routes/m", nil, 204, 404, "")
	change(g1, "POST", base+"/routes", route("m", "q"), 201, 200, a+"/q")
	t.Logf("a change answered by one gateway served by both after (each gateway, each change): %s; worst %s", strings.Join(took, " "), worst)
	g1.waitReplicas(converge, g1.replica, g2.replica)
	g2.waitReplicas(converge, g1.replica, g2.replica)

	// g2 stops following (a restart, a cut network): it misses two changes, and catches up from the
	// generation as soon as it follows again.
	f2.Stop()
	want(t, g1.su("PUT", base+"/routes/m", route("m", "p")), 200, "")
	want(t, g1.su("PUT", base+"/providers/p", provider("p", g1.S.URL)), 200, "")
	g1.waitServes("m", key, 200, a+"/p", time.Now(), converge)
	time.Sleep(100 * time.Millisecond)
	if _, p, _ := g2.tryChat("m", key); p != a+"/q" {
		t.Fatalf("g2 serves %q without following", p)
	}
	restarted := time.Now()
	g2.follow(time.Hour)
	d := g2.waitServes("m", key, 200, a+"/p", restarted, converge)
	g2.waitReplicas(converge, g1.replica, g2.replica)
	t.Logf("caught up %s after following again", d.Round(100*time.Microsecond))

	// Concurrent PUTs of one route through both gateways, without If-Match: each is checked and written
	// whole onto the state before it; the last written is what is stored and served.
	const n = 8
	type result struct {
		status  int
		version int64
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := []*env{g1, g2}[i%2]
			body := map[string]any{"targets": []map[string]any{{"provider": "p", "model": fmt.Sprint("up-", i)}}}
			r := via.su("PUT", base+"/routes/m", body)
			var rv routeView
			if r.status == 200 {
				r.json(t, &rv)
			}
			results[i] = result{r.status, rv.Version}
		}()
	}
	wg.Wait()
	last, versions := 0, map[int64]bool{}
	for i, r := range results {
		if r.status != 200 || versions[r.version] {
			t.Fatalf("concurrent PUTs without If-Match: %+v; want all 200 with distinct versions", results)
		}
		versions[r.version] = true
		if r.version > results[last].version {
			last = i
		}
	}
	for _, g := range []*env{g1, g2} {
		var rv routeView
		g.su("GET", base+"/routes/m", nil).json(t, &rv)
		if rv.Version != results[last].version || len(rv.Targets) != 1 || rv.Targets[0].Model != fmt.Sprint("up-", last) {
			t.Fatalf("stored route %+v; want the PUT that got version %d (up-%d), whole", rv, results[last].version, last)
		}
	}

	// With If-Match, of concurrent PUTs of the same version through both gateways exactly one wins.
	statuses := make([]int, n)
	version := fmt.Sprintf(`"%d"`, results[last].version)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			via := []*env{g1, g2}[i%2]
			statuses[i] = via.su("PUT", base+"/routes/m", route("m", "q"), "If-Match", version).status
		}()
	}
	wg.Wait()
	slices.Sort(statuses)
	if statuses[0] != 200 || statuses[1] != 409 || statuses[n-1] != 409 {
		t.Fatalf("concurrent PUTs with If-Match %s: statuses %v; want one 200 and the rest 409", version, statuses)
	}
	answered := time.Now()
	g1.waitServes("m", key, 200, a+"/q", answered, converge)
	g2.waitServes("m", key, 200, a+"/q", answered, converge)
}

// TestFleetDatabaseRestart: under a load spread over two gateways, PostgreSQL stops and starts again. No
// data-plane request fails (the gateways serve their last config); while the database is down the API
// answers 503 store_unavailable and GET /api/v1/state still answers; once it is back a change through one
// gateway is served by both, and both report the same generation.
func TestFleetDatabaseRestart(t *testing.T) {
	pg := pgtest.New(t)
	dsn := pg.NewDatabase(t)
	g1, g2 := newEnvAt(t, dsn), newEnvAt(t, dsn)
	g1.follow(time.Hour)
	g2.follow(time.Hour)
	a := g1.mkOrg("fleet")
	key := g1.orgKey(a)
	base := "/api/v1/orgs/" + a
	want(t, g1.su("POST", base+"/providers", provider("p", g1.A.URL)), 201, "")
	want(t, g1.su("POST", base+"/providers", provider("q", g1.B.URL)), 201, "")
	want(t, g1.su("POST", base+"/routes", route("m", "p")), 201, "")
	answered := time.Now()
	g2.waitServes("m", key, 200, a+"/p", answered, converge)

	var mu sync.Mutex
	ok, failed := 0, []string{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				g := []*env{g1, g2}[(w+i)%2]
				status, _, err := g.tryChat("m", key)
				mu.Lock()
				if err != nil || status != 200 {
					failed = append(failed, fmt.Sprintf("%s: %d %v", g.replica, status, err))
				} else {
					ok++
				}
				mu.Unlock()
			}
		}()
	}
	stopLoad := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}
	defer stopLoad()

	time.Sleep(300 * time.Millisecond)
	pg.Stop()
	want(t, g1.su("PUT", base+"/routes/m", route("m", "q")), 503, "store_unavailable", "keeps serving its last config")
	want(t, g2.su("GET", "/api/v1/orgs/"+a+"/routes", nil), 503, "store_unavailable")
	if st := g2.stateOf(); st.ReplicasError == "" || len(st.Routes) != 2 {
		t.Fatalf("state while the store is down: %+v", st)
	}
	time.Sleep(time.Second)
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	var r apiResp
	for {
		if r = g1.su("PUT", base+"/routes/m", route("m", "q")); r.status != 503 || time.Since(back) > 10*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	want(t, r, 200, "")
	answered = time.Now()
	d1 := g1.waitServes("m", key, 200, a+"/q", answered, 5*time.Second)
	d2 := g2.waitServes("m", key, 200, a+"/q", answered, 5*time.Second)
	t.Logf("database back: first write accepted after %s; served by g1 after %s, by g2 after %s",
		answered.Sub(back).Round(time.Millisecond), d1.Round(100*time.Microsecond), d2.Round(100*time.Microsecond))
	time.Sleep(200 * time.Millisecond)
	stopLoad()
	g1.waitReplicas(5*time.Second, g1.replica, g2.replica)

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d data-plane requests ok, %d failed across the database restart", ok, len(failed))
	if len(failed) > 0 || ok < 100 {
		t.Fatalf("%d failed (%d ok); first: %q", len(failed), ok, failed[:min(len(failed), 5)])
	}
}

// TestFleetRefusedChange: a change one gateway accepts but another cannot serve (its own rolter.toml
// gives orgs less routing memory) leaves the other serving the generation it had, and GET /api/v1/state shows it
// behind with the reason; the next change it can serve brings it back in line.
func TestFleetRefusedChange(t *testing.T) {
	dsn := pgtest.Database(t)
	g1, g2 := newEnvAt(t, dsn), newEnvAt(t, dsn)
	g2.file.Store(parseFile(t, fileConfigText(g2.S.URL)+"[control.quotas]\nrouting_memory_bytes = 1048576\n"))
	if err := g2.srv.Reload(); err != nil {
		t.Fatal(err)
	}
	g1.follow(time.Hour)
	g2.follow(time.Hour)
	a := g1.mkOrg("fleet")
	key := g1.orgKey(a)
	base := "/api/v1/orgs/" + a
	want(t, g1.su("POST", base+"/providers", provider("p", g1.A.URL)), 201, "")
	want(t, g1.su("POST", base+"/routes", route("m", "p")), 201, "")
	g2.waitServes("m", key, 200, a+"/p", time.Now(), converge)
	// Serving the route comes before g2 records the generation it applied: wait until both gateways report
	// the store's generation, or "before" could be the one g2 was leaving.
	before := g1.waitReplicas(converge, g1.replica, g2.replica).StoreGeneration

	clash := route("clash", "p")
	clash["strategy"], clash["params"] = "cache_aware", map[string]any{"max_trie_bytes": 1 << 20}
	want(t, g1.su("POST", base+"/routes", clash), 201, "")
	answered := time.Now()
	g1.waitServes("clash", key, 200, a+"/p", answered, converge)
	for {
		st := g1.stateOf()
		i := slices.IndexFunc(st.Replicas, func(r replicaView) bool { return r.ID == g2.replica })
		if i >= 0 && st.Replicas[i].Generation == before && strings.Contains(st.Replicas[i].Error, `"clash"`) {
			t.Logf("g2 reported behind at generation %d (store at %d): %s", before, st.StoreGeneration, st.Replicas[i].Error)
			break
		}
		if time.Since(answered) > 5*time.Second {
			t.Fatalf("replicas %+v; want g2 at generation %d with the reason it refused", st.Replicas, before)
		}
		time.Sleep(10 * time.Millisecond)
	}
	g2.waitServes("m", key, 200, a+"/p", time.Now(), converge) // still serving what it had
	if g := g2.stateOf().StoreGeneration; g != before {
		t.Fatalf("g2 serves store generation %d, want %d", g, before)
	}

	want(t, g1.su("DELETE", base+"/routes/clash", nil), 204, "")
	g2.waitReplicas(converge, g1.replica, g2.replica)
}
