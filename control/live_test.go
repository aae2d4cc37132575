package control

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// TestAPILiveChangeUnderLoad: under a loopback load of streaming and non-streaming requests at
// concurrency 32 against simulated engines, API changes - a new provider added to the route, the strategy
// switched, a target removed - fail no request, and the new target takes traffic within a second of the
// API's answer.
func TestAPILiveChangeUnderLoad(t *testing.T) {
	var urls []string
	for i := 0; i < 3; i++ {
		c := sim.DefaultConfig()
		c.EngineLabel = fmt.Sprint(i)
		c.DecodePerToken = 3 * time.Millisecond
		e, err := sim.New(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Stop)
		urls = append(urls, e.URL())
	}
	e := newEnv(t, "")
	a := e.mkOrg("live")
	base := "/api/v1/orgs/" + a
	want(t, e.su("POST", base+"/providers", provider("s1", urls[0])), 201, "")
	want(t, e.su("POST", base+"/providers", provider("s2", urls[1])), 201, "")
	want(t, e.su("POST", base+"/routes", map[string]any{"model": "m", "strategy": "cache_aware", "targets": []map[string]any{{"provider": "s1", "model": "sim-model"}, {"provider": "s2", "model": "sim-model"}}}), 201, "")
	key := e.orgKey(a)

	var mu sync.Mutex
	ok, failed := 0, []string{}
	first := map[string]time.Time{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	system := strings.Repeat("You are the fleet's assistant. ", 20)
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				stream := (w+i)%2 == 0
				body := fmt.Sprintf(`{"model":"m","stream":%v,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":"q%d"}]}`, stream, system, (w+i)%30)
				req, _ := http.NewRequest("POST", e.gwURL+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				var got []byte
				if err == nil {
					got, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				switch {
				case err != nil:
					failed = append(failed, err.Error())
				case resp.StatusCode != 200:
					failed = append(failed, fmt.Sprintf("%d %s", resp.StatusCode, got))
				case stream && !strings.HasSuffix(string(got), "data: [DONE]\n\n"):
					failed = append(failed, "stream without [DONE]")
				default:
					ok++
					if t := resp.Header.Get("X-Rolter-Target"); first[t].IsZero() {
						first[t] = time.Now()
					}
				}
				mu.Unlock()
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()

	time.Sleep(400 * time.Millisecond)
	want(t, e.su("POST", base+"/providers", provider("s3", urls[2])), 201, "")
	want(t, e.su("PUT", base+"/routes/m", map[string]any{"strategy": "cache_aware", "targets": []map[string]any{{"provider": "s1", "model": "sim-model"}, {"provider": "s2", "model": "sim-model"}, {"provider": "s3", "model": "sim-model"}}}), 200, "")
	added := time.Now()
	time.Sleep(600 * time.Millisecond)
	want(t, e.su("PUT", base+"/routes/m", map[string]any{"strategy": "pipeline", "targets": []map[string]any{{"provider": "s1", "model": "sim-model"}, {"provider": "s2", "model": "sim-model"}, {"provider": "s3", "model": "sim-model"}}}), 200, "")
	time.Sleep(500 * time.Millisecond)
	// s1 has streams in flight; it leaves the route.
	want(t, e.su("PUT", base+"/routes/m", map[string]any{"strategy": "pipeline", "targets": []map[string]any{{"provider": "s2", "model": "sim-model"}, {"provider": "s3", "model": "sim-model"}}}), 200, "")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d requests ok, %d failed across 3 API changes", ok, len(failed))
	if len(failed) > 0 || ok < 100 {
		t.Fatalf("%d failed (%d ok); first: %q", len(failed), ok, failed[:min(len(failed), 5)])
	}
	s3 := a + "/s3"
	if first[s3].IsZero() {
		t.Fatal("the added target never answered")
	}
	if d := first[s3].Sub(added); d > time.Second {
		t.Fatalf("the added target first answered %s after the API's answer, want within 1s", d)
	}
}
