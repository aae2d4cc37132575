package cluster_test

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/rolter-ai/rolter/cluster/natstest"
	"github.com/rolter-ai/rolter/engine"
)

// A third client on the fleet's subject, as a hostile peer would be: plain nats.go publishing crafted load
// and evidence messages. With a shared key the fleet refuses all of it; without one, what it can claim is
// bounded.

const testKeyEnv = "TEST_CLUSTER_KEY"

// withCluster adds lines to a config's [cluster] section.
func withCluster(cfgText, lines string) string {
	return strings.Replace(cfgText, "[cluster]\n", "[cluster]\n"+lines+"\n", 1)
}

// subjectOf is a config's [cluster] subject.
func subjectOf(gw *gateway) string { return gw.cfg.Cluster.Subject }

// flood publishes msgs on subject every few milliseconds until the test ends.
func flood(t *testing.T, nc *nats.Conn, subject string, msgs ...[]byte) {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, m := range msgs {
				_ = nc.Publish(subject, m)
			}
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// hugeClaims is a load message claiming the most in-flight a load message may on p0 and p1, bare and
// inside an envelope with a made-up MAC.
func hugeClaims(id string) (bare, forged []byte) {
	bare = []byte(fmt.Sprintf(`{"id":%q,"inflight":{"p0":16777216,"p1":16777216}}`, id))
	forged = make([]byte, 25, 25+len(bare))
	forged[0] = 2
	binary.LittleEndian.PutUint64(forged[1:], uint64(time.Now().UnixNano()))
	copy(forged[9:25], "not the real mac")
	return bare, append(forged, bare...)
}

// targetsOf sends n fresh conversations to gw and counts where they went.
func targetsOf(t *testing.T, gw *gateway, n int, name string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n; i++ {
		code, h := post(t, gw, chat(system(fmt.Sprintf("%s %d", name, i)), "hi"))
		if code != 200 {
			t.Fatalf("request %d: status %d", i, code)
		}
		got[h.Get("X-Rolter-Target")]++
	}
	return got
}

func TestForgedLoadWithKey(t *testing.T) {
	// The attack: claim huge in-flight counts on two of three engines. With a key, the claims are
	// refused and least_load still spreads b's requests over all three.
	t.Setenv(testKeyEnv, strings.Repeat("fleet key ", 4))
	ns := natstest.New(t)
	ups := upstreams(t, 3)
	text := withCluster(fleetConfig(t, ns.URL(), "least_load", "", ups, nil), `key_env = "`+testKeyEnv+`"`)
	a, b := startGateway(t, text), startGateway(t, text)
	ca, cb := a.join(t), b.join(t)
	waitPeers(t, ca, cb) // the replicas' own envelopes pass

	bare, forged := hugeClaims("rolter-attacker")
	flood(t, rawClient(t, ns.URL()), subjectOf(b)+".load", bare, forged)
	waitFor(t, "b to refuse the crafted messages", func() bool {
		r := cb.Stats().Refused
		return r["unauthenticated"] > 3 && r["bad_mac"] > 3
	})
	got := targetsOf(t, b, 30, "keyed load")
	if got["p0"] == 0 || got["p1"] == 0 || got["p0"]+got["p1"] < 10 {
		t.Fatalf("b's 30 requests went %v: the forged claims steered them away from p0 and p1", got)
	}
	if s := cb.Stats(); s.Peers != 1 {
		t.Fatalf("b counts %d peers; want 1 (a): the attacker became one", s.Peers)
	}
	if m := metricsText(cb); !strings.Contains(m, "\nrolter_cluster_refused_total{reason=\"unauthenticated\"} ") {
		t.Fatalf("metrics:\n%s", m)
	}
}

func TestForgedLoadWithoutKey(t *testing.T) {
	// The control: without a key the same flood steers b's requests away from p0 and p1 (30 of 30
	// requests), though each claim is cut to the cap (max_conns, 1024 here).
	ns := natstest.New(t)
	ups := upstreams(t, 3)
	b := startGateway(t, fleetConfig(t, ns.URL(), "least_load", "", ups, nil))
	cb := b.join(t)
	waitFor(t, "connected", func() bool { return cb.Stats().Connected })
	bare, _ := hugeClaims("rolter-attacker")
	flood(t, rawClient(t, ns.URL()), subjectOf(b)+".load", bare)
	waitFor(t, "b to take the claims", func() bool { return cb.Stats().Refused["inflight_capped"] > 0 })
	if got := targetsOf(t, b, 30, "bare load"); got["p2"] != 30 {
		t.Fatalf("b's 30 requests went %v; want all on p2: the test does not reproduce the attack", got)
	}
}

// capturedEvidence runs a conversation's first turn through the attacker's own gateway (a fleet of its
// own on another subject of the same NATS) and returns the evidence message it published, as the
// attacker sees it: that is how it learns the checkpoints of a prompt without any victim having seen it.
func capturedEvidence(t *testing.T, nc *nats.Conn, x *gateway, sys string) []byte {
	t.Helper()
	ch := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(subjectOf(x)+".evidence", ch)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if code, _ := post(t, x, chat(sys, "What is a prefix cache?")); code != 200 {
		t.Fatalf("attacker's first turn: status %d", code)
	}
	select {
	case m := <-ch:
		return m.Data
	case <-time.After(20 * time.Second):
		t.Fatal("the attacker's gateway published no evidence")
		return nil
	}
}

// retarget rewrites a bare evidence message's records to name engine, from a replica id of its own.
func retarget(msg []byte, engine uint64) []byte {
	out := append([]byte(nil), msg...)
	binary.LittleEndian.PutUint64(out[1:], 0xbad)
	for b := out[9:]; len(b) >= 9; {
		binary.LittleEndian.PutUint64(b, engine)
		b = b[9+8*int(b[8]):]
	}
	return out
}

// plantEvidence makes 5 conversations no victim has seen claim to be held by p2 on gateway b's subject,
// and returns b's decision and target for each second turn.
func plantEvidence(t *testing.T, ns *natstest.Server, ups []*upstream, b *gateway, wantRefused string) (decisions, targets []string) {
	t.Helper()
	nc := rawClient(t, ns.URL())
	x := startGateway(t, strings.Replace(fleetConfig(t, ns.URL(), "cache_aware", "", ups, nil),
		"subject = \"", "subject = \"attacker.", 1))
	x.join(t)
	p2 := engine.PeerID("p2", "up-model")
	for i := 0; i < 5; i++ {
		sys := system(fmt.Sprintf("never seen %d", i))
		planted := retarget(capturedEvidence(t, nc, x, sys), p2)
		before := b.c.Stats()
		if err := nc.Publish(subjectOf(b)+".evidence", planted); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "b to take or refuse the planted evidence", func() bool {
			s := b.c.Stats()
			return s.EvidenceReceived > before.EvidenceReceived && (wantRefused == "" || s.Refused[wantRefused] > before.Refused[wantRefused])
		})
		code, h := post(t, b, chat(sys, "What is a prefix cache?", "ok", "And why does routing matter?"))
		if code != 200 {
			t.Fatalf("second turn: status %d", code)
		}
		decisions, targets = append(decisions, h.Get("X-Rolter-Decision")), append(targets, h.Get("X-Rolter-Target"))
	}
	return decisions, targets
}

func TestForgedEvidenceWithKey(t *testing.T) {
	// The second attack: evidence for conversations no replica has seen, naming an engine the
	// attacker chose, made 5 of 5 of them prefix_hit there. With a key none of it is taken, while the
	// replicas' own evidence still is.
	t.Setenv(testKeyEnv, strings.Repeat("fleet key ", 4))
	ns := natstest.New(t)
	ups := upstreams(t, 3)
	text := withCluster(fleetConfig(t, ns.URL(), "cache_aware", "", ups, nil), `key_env = "`+testKeyEnv+`"`)
	a, b := startGateway(t, text), startGateway(t, text)
	waitPeers(t, a.join(t), b.join(t))
	if _, decision, _ := turns(t, a, b, "a real conversation"); decision != "prefix_hit" {
		t.Fatalf("b decided %q on a's evidence; want prefix_hit: keyed evidence does not flow", decision)
	}
	decisions, _ := plantEvidence(t, ns, ups, b, "unauthenticated")
	for i, d := range decisions {
		if d == "prefix_hit" {
			t.Fatalf("conversation %d: b decided prefix_hit on planted evidence (%v)", i, decisions)
		}
	}
	if s := b.c.Stats(); s.Refused["unauthenticated"] < 5 {
		t.Fatalf("refused %v; want the 5 planted messages", s.Refused)
	}
}

func TestForgedEvidenceWithoutKey(t *testing.T) {
	// The control of the test above, and what happens without a key: the planted evidence is taken,
	// and every planted conversation is a prefix_hit on p2. This is why a nats_url off loopback needs one.
	ns := natstest.New(t)
	ups := upstreams(t, 3)
	b := startGateway(t, fleetConfig(t, ns.URL(), "cache_aware", "", ups, nil))
	b.join(t)
	waitFor(t, "connected", func() bool { return b.c.Stats().Connected })
	decisions, targets := plantEvidence(t, ns, ups, b, "")
	for i := range decisions {
		if decisions[i] != "prefix_hit" || targets[i] != "p2" {
			t.Fatalf("conversation %d: %s on %s; want the attack to land (prefix_hit on p2): %v %v", i, decisions[i], targets[i],
				decisions, targets)
		}
	}
}

func TestForgedClaimsBoundedWithoutKey(t *testing.T) {
	// Without a key (NATS on loopback) a third client's messages are taken, but one peer cannot claim more
	// than the cap per provider, nor send evidence past its rate, and peers past max_peers are refused.
	ns := natstest.New(t)
	ups := upstreams(t, 3)
	text := withCluster(fleetConfig(t, ns.URL(), "least_load", "", ups, nil),
		"max_peer_inflight = 4\nmax_peers = 3\npeer_evidence_per_sec = 20")
	b := startGateway(t, text)
	cb := b.join(t)
	waitFor(t, "connected", func() bool { return cb.Stats().Connected })
	nc := rawClient(t, ns.URL())
	bare, _ := hugeClaims("rolter-attacker")
	flood(t, nc, subjectOf(b)+".load", bare)
	load := func(name string) int64 {
		for _, p := range b.g.Snapshot().Providers {
			if p.Name == name {
				return p.Load()
			}
		}
		return -1
	}
	waitFor(t, "b to take the capped claims", func() bool { return load("p0") == 4 && load("p1") == 4 })
	time.Sleep(100 * time.Millisecond) // more floods arrive: the loads stay at the cap
	if load("p0") != 4 || load("p1") != 4 || load("p2") != 0 {
		t.Fatalf("loads p0 %d, p1 %d, p2 %d; want 4, 4, 0: one peer claimed past max_peer_inflight", load("p0"), load("p1"), load("p2"))
	}
	if cb.Stats().Refused["inflight_capped"] == 0 {
		t.Fatalf("refused %v; want inflight_capped counted", cb.Stats().Refused)
	}

	// More peers than max_peers: the extra ones are refused (b has the attacker and two more).
	for i := 0; i < 10; i++ {
		m, _ := hugeClaims(fmt.Sprintf("rolter-sybil-%d", i))
		if err := nc.Publish(subjectOf(b)+".load", m); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "too_many_peers", func() bool { return cb.Stats().Refused["too_many_peers"] >= 8 })
	if p := cb.Stats().Peers; p > 3 {
		t.Fatalf("%d peers; want at most max_peers 3", p)
	}
	if l := load("p0"); l > 3*4 {
		t.Fatalf("p0 load %d; want at most max_peers x max_peer_inflight", l)
	}

	// Evidence past a peer's rate is refused: 100 records at once from one sender, 20 a second allowed.
	msg := []byte{1}
	msg = binary.LittleEndian.AppendUint64(msg, 0xe71)
	for i := 0; i < 100; i++ {
		msg = binary.LittleEndian.AppendUint64(msg, uint64(i))
		msg = append(msg, 1)
		msg = binary.LittleEndian.AppendUint64(msg, uint64(1000+i))
	}
	before := cb.Stats()
	if err := nc.Publish(subjectOf(b)+".evidence", msg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "rate_limited", func() bool { return cb.Stats().Refused["rate_limited"] > before.Refused["rate_limited"] })
	if s := cb.Stats(); s.Entries != before.Entries {
		t.Fatalf("%d evidence entries after a refused flood; want %d", s.Entries, before.Entries)
	}
}
