package dnssrc

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/internal/dnstest"
	"github.com/rolter-ai/rolter/internal/syncbuf"
)

// Generous bounds for what a Watcher must do: dnsmasq answers with a TTL of 1s.
const (
	within    = 8 * time.Second
	quietSpan = 1500 * time.Millisecond
)

// source is a "dns" source of record and name at the server addr, asking again every 50ms to maxTTL.
func source(record, name, addr string, maxTTL float64) *config.SourceConfig {
	return &config.SourceConfig{
		Name: "fleet", Kind: config.SourceDNS, Port: 8000,
		DNS: &config.DNSSource{Name: name, Record: record, Resolver: addr, MinTTLSecs: 0.05, MaxTTLSecs: maxTTL, TimeoutSecs: 1},
	}
}

// newWatcher is New, failing the test on an error; it logs nowhere unless opts say.
func newWatcher(t *testing.T, sc *config.SourceConfig, opts Options) *Watcher {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w, err := New(sc, opts)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestWatchA follows a name's A and AAAA records as the hosts file changes, at the answer's TTL: with
// max_ttl_secs 30 the change is seen only if the 1s TTL is honoured.
func TestWatchA(t *testing.T) {
	d := dnstest.Start(t, "", "127.0.0.11 web.test\n127.0.0.12 web.test\n::1 web.test\n")
	r := startWatch(t, newWatcher(t, source(config.RecordA, "web.test", d.Addr(), 30), Options{}))
	r.awaitSet(t, within, "web.test 127.0.0.11:8000", "web.test 127.0.0.12:8000", "web.test [::1]:8000")

	d.SetHosts("127.0.0.12 web.test\n127.0.0.13 web.test\n::1 web.test\n")
	r.awaitSet(t, within, "web.test 127.0.0.12:8000", "web.test 127.0.0.13:8000", "web.test [::1]:8000")
}

// TestWatchUnchanged calls Set once for a set that stays as it is, however often it is asked for.
func TestWatchUnchanged(t *testing.T) {
	d := dnstest.Start(t, "", "127.0.0.11 web.test\n")
	r := startWatch(t, newWatcher(t, source(config.RecordA, "web.test.", d.Addr(), 0.1), Options{}))
	r.awaitSet(t, within, "web.test 127.0.0.11:8000")
	r.quiet(t, quietSpan)
}

// TestWatchSRV follows SRV records of two targets on two ports, addresses from the additional section.
func TestWatchSRV(t *testing.T) {
	conf := "srv-host=_http._tcp.svc.test,a.svc.test,8000,0,0\n" +
		"srv-host=_http._tcp.svc.test,b.svc.test,8001,0,0\n" +
		"srv-host=_http._tcp.svc.test,b.svc.test,8002,1,0\n"
	d := dnstest.Start(t, conf, "127.0.0.11 a.svc.test\n127.0.0.12 b.svc.test\n::12 b.svc.test\n")
	r := startWatch(t, newWatcher(t, source(config.RecordSRV, "_http._tcp.svc.test", d.Addr(), 0.2), Options{}))
	r.awaitSet(t, within, "a.svc.test 127.0.0.11:8000", "b.svc.test 127.0.0.12:8001", "b.svc.test 127.0.0.12:8002",
		"b.svc.test [::12]:8001", "b.svc.test [::12]:8002")

	// srv-host lines are read at start only.
	d.Restart("srv-host=_http._tcp.svc.test,b.svc.test,8001,0,0\n")
	r.awaitSet(t, within, "b.svc.test 127.0.0.12:8001", "b.svc.test [::12]:8001")
}

// TestWatchNXDOMAIN reports a name that does not exist as an empty set, not a failure, and follows it
// when it comes to exist.
func TestWatchNXDOMAIN(t *testing.T) {
	d := dnstest.Start(t, "", "")
	ra := startWatch(t, newWatcher(t, source(config.RecordA, "gone.test", d.Addr(), 0.2), Options{}))
	rs := startWatch(t, newWatcher(t, source(config.RecordSRV, "_http._tcp.gone.test", d.Addr(), 0.2), Options{}))
	if got := ra.nextSet(t, within); got != nil {
		t.Fatalf("A: Set(%q), want Set(nil)", got)
	}
	if got := rs.nextSet(t, within); got != nil {
		t.Fatalf("SRV: Set(%q), want Set(nil)", got)
	}
	d.SetHosts("127.0.0.11 gone.test\n")
	ra.awaitSet(t, within, "gone.test 127.0.0.11:8000")
}

// TestWatchServerDown reports Fail while the server is away, with no Set (the last set stands), and the
// set again once it is back, though it did not change.
func TestWatchServerDown(t *testing.T) {
	d := dnstest.Start(t, "", "127.0.0.11 web.test\n")
	var log syncbuf.Buffer
	opts := Options{Logger: slog.New(slog.NewTextHandler(&log, nil))}
	r := startWatch(t, newWatcher(t, source(config.RecordA, "web.test", d.Addr(), 0.2), opts))
	r.awaitSet(t, within, "web.test 127.0.0.11:8000")

	d.Stop()
	if err := r.nextFail(t, within); !strings.Contains(err.Error(), "web.test. A") {
		t.Fatalf("Fail(%v), want it to name the question", err)
	}
	d.Restart("")
	for {
		e := r.next(t, within)
		if e.err == nil {
			if got := describe(t, e.set); len(got) != 1 || got[0] != "web.test 127.0.0.11:8000" {
				t.Fatalf("Set(%q) after the server came back, want the same set", got)
			}
			break
		}
	}
	if !strings.Contains(log.String(), "cannot resolve the source's endpoints") {
		t.Fatalf("the failure is not logged: %s", log.String())
	}
}

// TestWatchRefused leaves out an address the egress policy refuses, logging it once, not as a failure.
func TestWatchRefused(t *testing.T) {
	d := dnstest.Start(t, "", "127.0.0.11 web.test\n169.254.169.254 web.test\n0.0.0.0 web.test\n")
	var log syncbuf.Buffer
	var (
		mu      sync.Mutex
		checked []string
	)
	opts := Options{
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Check: func(name string, a netip.Addr) error {
			mu.Lock()
			checked = append(checked, name)
			mu.Unlock()
			if a == netip.MustParseAddr("169.254.169.254") {
				return errors.New("metadata address")
			}
			return nil
		},
	}
	r := startWatch(t, newWatcher(t, source(config.RecordA, "web.test", d.Addr(), 0.1), opts))
	r.awaitSet(t, within, "web.test 127.0.0.11:8000")
	r.quiet(t, quietSpan)
	if n := strings.Count(log.String(), "169.254.169.254"); n != 1 {
		t.Fatalf("the refused address is logged %d times, want once: %s", n, log.String())
	}
	if !strings.Contains(log.String(), "0.0.0.0") || !strings.Contains(log.String(), "metadata address") {
		t.Fatalf("the refusals are not logged with why: %s", log.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(checked) == 0 || checked[0] != "web.test" {
		t.Fatalf("Check was given the names %q, want web.test", checked)
	}
}

// TestWatchTruncated takes a name with more A records than 512 bytes of UDP hold over TCP: every one is
// in the set.
func TestWatchTruncated(t *testing.T) {
	var hosts, want []string
	for i := 1; i <= 60; i++ {
		hosts = append(hosts, fmt.Sprintf("127.0.1.%d many.test", i))
		want = append(want, fmt.Sprintf("many.test 127.0.1.%d:8000", i))
	}
	d := dnstest.Start(t, "", strings.Join(hosts, "\n")+"\n")
	w := newWatcher(t, source(config.RecordA, "many.test", d.Addr(), 0.2), Options{})
	q, _ := newQuestion("many.test", 1)
	if a, err := w.exchangeUDP(t.Context(), q); err != nil || !a.truncated {
		t.Fatalf("the UDP answer: %+v, %v; want it truncated", a, err)
	}
	r := startWatch(t, w)
	r.awaitSet(t, within, want...)
}
