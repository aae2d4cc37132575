package cluster_test

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/cluster/natstest"
	"github.com/rolter-ai/rolter/config"
)

// TestSharedLimit: two gateways over a real nats-server keep a key's limit of 10 requests a minute
// together, each from its share (5): together they admit at most the limit plus one request per gateway
// (the shares' rounding) plus what refills meanwhile. With nats-server killed, each keeps holding its
// share - never the whole limit on its own - while it cannot hear the other.
func TestSharedLimit(t *testing.T) {
	const rpm = 10
	ns := natstest.New(t)
	ups := upstreams(t, 1)
	cfg := fleetConfig(t, ns.URL(), "round_robin", "", ups, nil)
	pepper := [32]byte{7}
	withKey := func(c *config.Config) {
		c.KeyPepper = pepper
		c.Keys = []config.DataKey{{Org: "org1", ID: "key_1", Hash: sha256.Sum256(append(pepper[:], "sk-shared"...)),
			Limits: &config.Limits{RPM: rpm}}}
	}
	a, b := startGatewayWith(t, cfg, withKey), startGatewayWith(t, cfg, withKey)
	ca, cb := a.join(t), b.join(t)
	waitPeers(t, ca, cb)
	waitFor(t, "both gateways to share the limits", func() bool { return a.g.LimitShare() == 2 && b.g.LimitShare() == 2 })
	start := time.Now()
	send := func(gw *gateway, n int) (ok int) {
		t.Helper()
		for range n {
			req := chat(system("shared"), "hi")
			resp, err := client.Do(mustRequest(t, gw.url, req, "Bearer sk-shared"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		return ok
	}
	okA, okB := send(a, rpm), send(b, rpm)
	refill := int(time.Since(start).Seconds()*rpm/60) + 1
	if okA < rpm/2 || okA+okB > rpm+2+refill {
		t.Fatalf("%d + %d requests admitted of a shared limit of %d (bound %d + 2 + %d refilled)", okA, okB, rpm, rpm, refill)
	}

	ns.Kill()
	waitFor(t, "both replicas to see NATS gone", func() bool { return !ca.Stats().Connected && !cb.Stats().Connected })
	waitFor(t, "the peers forgotten", func() bool { return ca.Stats().Peers == 0 && cb.Stats().Peers == 0 })
	if a.g.LimitShare() != 2 || b.g.LimitShare() != 2 {
		t.Fatalf("shares %d and %d with NATS down, want 2: a replica alone would admit the whole limit", a.g.LimitShare(), b.g.LimitShare())
	}
	more := send(a, rpm/2)
	if refill := int(time.Since(start).Seconds()*rpm/2/60) + 1; more > refill {
		t.Fatalf("with NATS down a admitted %d more of its spent share (%d refilled at most)", more, refill)
	}
}

func mustRequest(t *testing.T, url, body, auth string) *http.Request {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", auth)
	return req
}
