package engine

import (
	"strings"
	"testing"
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

// TestClusterConfig: [cluster] is checked like every section - each bad key named with its line - and the
// NATS servers' hosts go through the egress policy.
func TestClusterConfig(t *testing.T) {
	base := "[[providers]]\nname = \"a\"\napi_base = \"http://127.0.0.1:9\"\n[[routes]]\nmodel = \"m\"\n[[routes.targets]]\nprovider = \"a\"\n"
	f := func(section, want string) {
		t.Helper()
		cfg, err := ParseConfig([]byte(base+section), "c.toml")
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
	f("[cluster]\nnats_url = \"nats://10.0.0.1:4222, tls://nats.example:4443\"\nsubject = \"fleet-a.gw\"", "")
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
