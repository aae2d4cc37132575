package dnssrc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
)

func TestNew(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("# a comment\nsearch svc.cluster.local\nnameserver fd00::10\nnameserver 10.0.0.10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func() *config.SourceConfig { return source(config.RecordA, "web.test", "127.0.0.1:53", 30) }
	f := func(edit func(sc *config.SourceConfig), wantServer string, wantErrs ...string) {
		t.Helper()
		sc := ok()
		edit(sc)
		w, err := New(sc, Options{ResolvConf: conf})
		if len(wantErrs) == 0 {
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if w.server != wantServer {
				t.Fatalf("server %q, want %q", w.server, wantServer)
			}
			return
		}
		if err == nil {
			t.Fatalf("New took %+v", sc.DNS)
		}
		for _, want := range wantErrs {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("New: %v; want it to say %q", err, want)
			}
		}
	}
	f(func(*config.SourceConfig) {}, "127.0.0.1:53")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = "" }, "[fd00::10]:53")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = "kube-dns.kube-system:53" }, "kube-dns.kube-system:53")
	f(func(sc *config.SourceConfig) { sc.DNS.Record, sc.Port = config.RecordSRV, 0 }, "127.0.0.1:53")
	f(func(sc *config.SourceConfig) { sc.DNS.MinTTLSecs, sc.DNS.MaxTTLSecs = 5, 5 }, "127.0.0.1:53")

	f(func(sc *config.SourceConfig) { sc.Kind = config.SourceKubernetes }, "", `kind "dns"`)
	f(func(sc *config.SourceConfig) { sc.DNS = nil }, "", `kind "dns"`)
	f(func(sc *config.SourceConfig) { sc.DNS.Record = "mx" }, "", `dns.record must be "srv" or "a", not "mx"`)
	f(func(sc *config.SourceConfig) { sc.DNS.Name = "" }, "", "dns.name must be set")
	f(func(sc *config.SourceConfig) { sc.DNS.Name = "." }, "", "not the root")
	f(func(sc *config.SourceConfig) { sc.DNS.Name = strings.Repeat("a", 64) + ".test" }, "", "is not a DNS name")
	f(func(sc *config.SourceConfig) { sc.DNS.Name = "a..test" }, "", "is not a DNS name")
	f(func(sc *config.SourceConfig) { sc.DNS.Name = strings.Repeat("abcdefg.", 40) }, "", "is not a DNS name")
	f(func(sc *config.SourceConfig) { sc.Port = 0 }, "", "port must be 1 to 65535")
	f(func(sc *config.SourceConfig) { sc.Port = 70000 }, "", "port must be 1 to 65535")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = "10.0.0.1" }, "", "must be host:port")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = ":53" }, "", "must be host:port")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = "10.0.0.1:0" }, "", "must be host:port")
	f(func(sc *config.SourceConfig) { sc.DNS.Resolver = "10.0.0.1:dns" }, "", "must be host:port")
	f(func(sc *config.SourceConfig) { sc.DNS.MinTTLSecs = 0 }, "", "dns.min_ttl_secs must be above 0")
	f(func(sc *config.SourceConfig) { sc.DNS.MaxTTLSecs = -1 }, "", "dns.max_ttl_secs must be above 0")
	f(func(sc *config.SourceConfig) { sc.DNS.MaxTTLSecs = 1e9 }, "", "dns.max_ttl_secs must be above 0 and at most 86400")
	f(func(sc *config.SourceConfig) { sc.DNS.TimeoutSecs = 0 }, "", "dns.timeout_secs must be above 0")
	f(func(sc *config.SourceConfig) { sc.DNS.MinTTLSecs, sc.DNS.MaxTTLSecs = 10, 5 }, "", "must not be above dns.max_ttl_secs")
	// Every fault at once.
	f(func(sc *config.SourceConfig) { sc.DNS.Record, sc.DNS.Name, sc.DNS.TimeoutSecs = "x", "", 0 }, "",
		"dns.record", "dns.name", "dns.timeout_secs", `source "fleet"`)
}

func TestFirstNameserver(t *testing.T) {
	dir := t.TempDir()
	f := func(content, want string) {
		t.Helper()
		path := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := firstNameserver(path)
		if want == "" {
			if err == nil {
				t.Fatalf("%q: %q, want an error", content, got)
			}
			return
		}
		if err != nil || got != want {
			t.Fatalf("%q: %q, %v; want %q", content, got, err, want)
		}
	}
	f("nameserver 10.0.0.10\n", "10.0.0.10:53")
	f("search x\noptions ndots:5\nnameserver 10.96.0.10\nnameserver 10.0.0.1\n", "10.96.0.10:53")
	f("nameserver fe80::1%eth0\n", "[fe80::1%eth0]:53")
	f("nameserver not-an-address\nnameserver 10.0.0.2", "10.0.0.2:53")
	f("# nameserver 10.0.0.1\n", "")
	f("", "")
	if _, err := firstNameserver(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing resolv.conf gave a nameserver")
	}
}

func TestTTLClamp(t *testing.T) {
	f := func(secs []uint32, want time.Duration) {
		t.Helper()
		var tt ttl
		for _, s := range secs {
			tt.see(s)
		}
		if got := tt.clamp(time.Second, 30*time.Second); got != want {
			t.Errorf("%v: %s, want %s", secs, got, want)
		}
	}
	f(nil, time.Second)
	f([]uint32{0}, time.Second)
	f([]uint32{5}, 5*time.Second)
	f([]uint32{20, 5, 9}, 5*time.Second)
	f([]uint32{3600}, 30*time.Second)
	f([]uint32{1<<32 - 1}, 30*time.Second)
}

func TestBackoff(t *testing.T) {
	b := backoff{min: time.Second, max: 5 * time.Second}
	var got []time.Duration
	for range 5 {
		got = append(got, b.wait())
	}
	b.reset()
	got = append(got, b.wait())
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second, time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v, want %v", got, want)
		}
	}
}
