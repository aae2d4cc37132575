package engine

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rolter-ai/rolter/config"
)

// TestPeerFloor: every match rounds down to a checkpoint end (or stays, under the first).
func TestPeerFloor(t *testing.T) {
	for m := 0; m < 200<<10; m += 7 {
		want := m
		if m >= 256 {
			want = 0
			for _, e := range peerCheckpointEnds {
				if int(e) <= m {
					want = int(e)
				}
			}
		}
		if got := peerFloor(m); got != want {
			t.Fatalf("peerFloor(%d) = %d, want %d", m, got, want)
		}
	}
}

// TestPrefixName: a prefix ending at a checkpoint is named by its checkpoint, whether the request computed
// its checkpoints or not; other lengths by their own hash.
func TestPrefixName(t *testing.T) {
	key := []byte(strings.Repeat("0123456789abcdef", 1024)) // 16 KiB
	cps := peerCheckpoints(nil, key)
	cold := Pick{Key: key}
	warm := Pick{Key: key, cps: cps, cpsDone: true}
	for k, end := range peerCheckpointEnds[:len(cps)] {
		if a, b := cold.prefixName(int(end)), warm.prefixName(int(end)); a != cps[k] || b != cps[k] {
			t.Fatalf("checkpoint %d (%d bytes): %x and %x, want %x", k, end, a, b, cps[k])
		}
	}
	if cold.prefixName(100) == cold.prefixName(101) || cold.prefixName(100) != warm.prefixName(100) {
		t.Fatal("prefixes off the checkpoints")
	}
}

// TestPeerRound: a match maps to the middle of its checkpoint segment, at most the key's length; matches in
// one segment map alike.
func TestPeerRound(t *testing.T) {
	for _, c := range []struct{ m, n, want int }{
		{0, 100, 0}, {255, 300, 255}, {256, 10000, 384}, {511, 10000, 384}, {512, 10000, 640}, {300, 320, 320},
		{8 << 10, 1 << 20, 8<<10 + 512}, {8<<10 - 1, 1 << 20, 8<<10 - 128}, {9<<10 + 5, 1 << 20, 9<<10 + 512}, {64 << 10, 1 << 20, 68 << 10},
		{70 << 10, 1 << 20, 68 << 10}, {130 << 10, 1 << 20, 132 << 10},
	} {
		if got := peerRound(c.m, c.n); got != c.want {
			t.Fatalf("peerRound(%d, %d) = %d, want %d", c.m, c.n, got, c.want)
		}
	}
}

// TestClusterConfig: [cluster] is checked like every section - each bad key named with its line - and the
// NATS servers' hosts go through the egress policy.
func TestClusterConfig(t *testing.T) {
	base := "[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:9\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"
	f := func(section, want string) {
		t.Helper()
		cfg, err := config.Parse([]byte(base+section), "c.toml")
		switch {
		case want == "" && err != nil:
			t.Fatalf("%s: %s", section, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Fatalf("%s: %v, want %q", section, err, want)
		case want == "" && cfg.Cluster.Subject == "":
			t.Fatalf("%s: no default subject", section)
		}
	}
	f("", "")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"", "")
	t.Setenv("TEST_CLUSTER_KEY", strings.Repeat("k", config.MinClusterKeyBytes))
	t.Setenv("TEST_SHORT_KEY", strings.Repeat("k", config.MinClusterKeyBytes-1))
	t.Setenv("TEST_NATS_USER", "gw")
	t.Setenv("TEST_NATS_PASSWORD", "pw")
	f("[cluster]\nnats_url = \"nats://10.0.0.1:4222, tls://nats.example:4443\"\nsubject = \"fleet-a.gw\"\nkey_env = \"TEST_CLUSTER_KEY\"", "")
	// Off loopback, a shared key is required; on loopback it is optional.
	f("[cluster]\nnats_url = \"nats://10.0.0.1:4222\"", "cluster.key_env: missing: a nats_url off loopback needs a shared key")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222, nats://localhost:4223\"", "")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nkey_env = \"TEST_SHORT_KEY\"", "cluster.key_env: environment variable TEST_SHORT_KEY must hold a key of at least 32 bytes")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nkey_env = \"TEST_UNSET_KEY\"", "environment variable TEST_UNSET_KEY must hold")
	// NATS credentials: variables set, files readable, one kind at most.
	cluster := "[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\n"
	f(cluster+"user_env = \"TEST_NATS_USER\"\npassword_env = \"TEST_NATS_PASSWORD\"", "")
	f(cluster+"user_env = \"TEST_NATS_USER\"", "cluster.user_env: user_env and password_env go together")
	f(cluster+"user_env = \"TEST_NATS_USER\"\npassword_env = \"TEST_UNSET_PASSWORD\"", "cluster.password_env: environment variable TEST_UNSET_PASSWORD is empty or not set")
	f(cluster+"token_env = \"TEST_UNSET_TOKEN\"", "cluster.token_env: environment variable TEST_UNSET_TOKEN is empty or not set")
	f(cluster+"token_env = \"TEST_NATS_USER\"\nuser_env = \"TEST_NATS_USER\"\npassword_env = \"TEST_NATS_PASSWORD\"", "cannot use more than one of")
	f(cluster+"nkey_seed_file = \"/nonexistent/seed.nk\"", "cluster.nkey_seed_file: cannot read \"/nonexistent/seed.nk\": no such file or directory")
	f(cluster+"creds_file = \"/nonexistent/x.creds\"", "cluster.creds_file: cannot read \"/nonexistent/x.creds\"")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	f(cluster+"tls_ca_file = \""+notPEM+"\"", "cluster.tls_ca_file: cannot use \""+notPEM+"\": no PEM certificate in it")
	f(cluster+"tls_cert_file = \""+notPEM+"\"", "tls_cert_file and tls_key_file go together")
	f(cluster+"tls_cert_file = \""+notPEM+"\"\ntls_key_file = \""+notPEM+"\"", "cluster.tls_cert_file: cannot load the client certificate")
	f(cluster+"max_peers = 0", "cluster.max_peers")
	f(cluster+"max_peer_inflight = 0", "cluster.max_peer_inflight")
	f(cluster+"peer_evidence_per_sec = 0", "cluster.peer_evidence_per_sec")
	f("[cluster]\nnats_url = \"http://127.0.0.1:4222\"", "c.toml:9: cluster.nats_url: cannot use \"http://127.0.0.1:4222\"")
	f("[cluster]\nnats_url = \"nats://127.0.0.1\"", "want nats://host:port")
	f("[cluster]\nnats_url = \"nats://u:secret@127.0.0.1:4222\"", "credentials do not belong")
	f("[cluster]\nnats_url = \"nats://169.254.169.254:4222\"", "cluster.nats_url: ")
	f("[egress]\ndeny_hosts = [\"nats.internal\"]\n[cluster]\nnats_url = \"nats://nats.internal:4222\"", "deny_hosts nats.internal")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nsubject = \"rolter.*\"", "cluster.subject")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nsubject = \"a..b\"", "cluster.subject")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\npublish_interval_ms = 1", "cluster.publish_interval_ms: must be between 10 and 10000")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nmax_entries = 10", "cluster.max_entries")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nevidence_ttl_secs = 0", "cluster.evidence_ttl_secs")
	f("[cluster]\nnats_url = \"nats://127.0.0.1:4222\"\nqueue_size = 0", "cluster.queue_size")
}

// heldPeers is a Peers that holds the first k checkpoints of every key on every engine.
type heldPeers int

func (k heldPeers) Held(uint64, []uint64) int { return int(k) }
func (heldPeers) Routed(uint64, []uint64)     {}

// fakePeers is a Peers whose evidence is a map of engine -> checkpoints held.
type fakePeers struct {
	mu     sync.Mutex
	held   map[uint64]map[uint64]bool
	routed []uint64
}

func (f *fakePeers) Held(engine uint64, cps []uint64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := 0
	for k < len(cps) && f.held[engine][cps[k]] {
		k++
	}
	return k
}

func (f *fakePeers) Routed(engine uint64, cps []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil {
		f.held = map[uint64]map[uint64]bool{}
	}
	if f.held[engine] == nil {
		f.held[engine] = map[uint64]bool{}
	}
	for _, c := range cps {
		f.held[engine][c] = true
	}
	f.routed = append(f.routed, engine)
}

// TestCacheAwarePeerEvidence: what another replica sent to a target scores like the local trie, as far as
// its checkpoints reach, and a local copy does not outbid it by the bytes a checkpoint cannot see; without
// peer evidence nothing changes.
func TestCacheAwarePeerEvidence(t *testing.T) {
	r, s := cacheRoute(t, 4, "")
	var buf [maxTargets]int
	var cps [maxPeerCheckpoints]uint64
	var peerM [maxTargets]int32
	peers := &fakePeers{}
	p := Pick{peers: peers, cps: cps[:0], peerM: peerM[:4]}
	allEligible(r, &p, buf[:])
	system := strings.Repeat("a long shared system prompt. ", 100) // 2900 bytes
	p.Key = []byte(system + "question one")
	p.Opening = len(p.Key)
	home, _ := homeOf(&p)
	held := (home + 2) % 4
	// The other replica sent turn 1 to held: its checkpoints (every 256 bytes) are evidence for held.
	peers.Routed(r.Targets[held].peerID, peerCheckpoints(nil, p.Key))
	p.Key = []byte(system + "question one" + " answer and a follow-up question")
	got, d := rank(r, &p)
	if got != held || d.Reason != ReasonPrefixHit {
		t.Fatalf("got %d (%s), want %d prefix_hit", got, d.Reason, held)
	}
	// Checkpoints end every 256 bytes: the score is the middle of the segment they reach (2816..3072).
	if want := float64(min(2816+128, len(p.Key))) / float64(len(p.Key)); d.Score < want-1e-9 || d.Score > want+1e-9 {
		t.Fatalf("score %v, want %v", d.Score, want)
	}
	// This replica's own copy of the system prompt on another target (its trie matches 2909 bytes, beyond the
	// peers' last checkpoint at 2816) compares equal to the peers' copy: the two share the requests.
	other := (held + 1) % 4
	s.tries[other].Insert([]byte(system + "question two"))
	seen := map[int]int{}
	for range 400 {
		p.cpsDone = false
		got, d := rank(r, &p)
		if d.Reason != ReasonPrefixHit {
			t.Fatalf("local and peer copies: %s", d.Reason)
		}
		seen[got]++
	}
	if len(seen) != 2 || seen[held] < 100 || seen[other] < 100 {
		t.Fatalf("local and peer copies: picks %v, want both %d and %d", seen, held, other)
	}
	// With no peer evidence for the request, the trie's match is exact.
	fresh := &fakePeers{}
	p.peers, p.cpsDone = fresh, false
	if got, d := rank(r, &p); got != other || d.Score != float64(len(system+"question "))/float64(len(p.Key)) {
		t.Fatalf("no peer evidence: %d score %v, want %d exact", got, d.Score, other)
	}
	p.peers = peers
	s.tries[other].Reset()
	// A prompt shorter than the first checkpoint has no evidence.
	p.Key, p.cpsDone = []byte("short"), false
	if _, d := rank(r, &p); d.Reason == ReasonPrefixHit {
		t.Fatalf("short prompt: %s", d.Reason)
	}
	// pipeline scores the peers' evidence too: held wins at equal loads.
	rp := testRoute(t, "pipeline", []float64{1, 1, 1, 1}, "")
	pp := Pick{peers: peers, cps: cps[:0], peerM: peerM[:4], Key: []byte(system + "question one" + " answer and a follow-up question")}
	allEligible(rp, &pp, buf[:])
	if got, d := rank(rp, &pp); got != held || d.Reason != ReasonScore || d.Score < 0.5 {
		t.Fatalf("pipeline: got %d (%s %.2f), want %d", got, d.Reason, d.Score, held)
	}
	// Without peers the same request is not a hit.
	p.peers, p.cpsDone = nil, false
	p.Key = []byte(system + "question one" + " answer and a follow-up question")
	if _, d := rank(r, &p); d.Reason == ReasonPrefixHit {
		t.Fatalf("no peers: %s", d.Reason)
	}
}

// TestPeerCheckpoints: the chain names prefixes - equal first bytes, equal checkpoints; one byte changed,
// every checkpoint from its block on differs - at the documented offsets.
func TestPeerCheckpoints(t *testing.T) {
	key := make([]byte, 200<<10)
	for i := range key {
		key[i] = byte(i * 7)
	}
	a := peerCheckpoints(nil, key)
	if len(a) != maxPeerCheckpoints {
		t.Fatalf("%d checkpoints for 200 KiB, want %d", len(a), maxPeerCheckpoints)
	}
	if n := len(peerCheckpoints(nil, key[:255])); n != 0 {
		t.Fatalf("255 bytes: %d checkpoints", n)
	}
	if n := len(peerCheckpoints(nil, key[:8<<10])); n != 32 {
		t.Fatalf("8 KiB: %d checkpoints, want 32", n)
	}
	if n := len(peerCheckpoints(nil, key[:64<<10])); n != 32+56 {
		t.Fatalf("64 KiB: %d checkpoints, want 88", n)
	}
	key2 := append([]byte(nil), key...)
	key2[5000] ^= 1 // in the 20th block (4864..5120)
	b := peerCheckpoints(nil, key2)
	for k := range a {
		if same := a[k] == b[k]; same != (k < 19) {
			t.Fatalf("checkpoint %d (ends at %d): equal %v", k, peerCheckpointEnds[k], same)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		var cps [maxPeerCheckpoints]uint64
		_ = peerCheckpoints(cps[:0], key)
	}); n != 0 {
		t.Fatalf("%v allocs", n)
	}
}
