package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

func mustPolicy(t *testing.T, c Config) *Policy {
	t.Helper()
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOrderOfEvaluation pins the documented order: deny_hosts, deny_cidrs, allow_hosts, allow_cidrs, the
// block_* categories, allow.
func TestOrderOfEvaluation(t *testing.T) {
	p := mustPolicy(t, Config{
		BlockLinkLocal: true, BlockLoopback: true, BlockPrivate: true,
		AllowHosts: []string{"vllm.internal", "*.fleet.example"},
		DenyHosts:  []string{"admin.fleet.example", "*.evil.example"},
		AllowCIDRs: []string{"10.1.0.0/16", "169.254.169.254"},
		DenyCIDRs:  []string{"10.1.2.0/24", "203.0.113.0/24"},
	})
	f := func(name, addr, wantRule string) {
		t.Helper()
		err := p.CheckAddr(name, netip.MustParseAddr(addr))
		var r *Refusal
		switch {
		case wantRule == "" && err != nil:
			t.Fatalf("%s %s: refused (%s), want allowed", name, addr, err)
		case wantRule != "" && !errors.As(err, &r):
			t.Fatalf("%s %s: allowed, want refused by %s", name, addr, wantRule)
		case wantRule != "" && !strings.HasPrefix(r.Rule, wantRule):
			t.Fatalf("%s %s: refused by %q, want %s", name, addr, r.Rule, wantRule)
		}
	}
	f("admin.fleet.example", "8.8.8.8", "deny_hosts") // deny_hosts beats allow_hosts *.fleet.example
	f("x.evil.example", "10.1.1.1", "deny_hosts")     // and beats allow_cidrs
	f("vllm.internal", "10.1.2.3", "deny_cidrs")      // deny_cidrs beats allow_hosts
	f("", "10.1.2.3", "deny_cidrs")                   // and allow_cidrs
	f("vllm.internal", "192.168.1.1", "")             // allow_hosts opens block_private
	f("gpu.fleet.example", "10.9.9.9", "")            // *.suffix
	f("fleet.example", "10.9.9.9", "block_private")   // *.suffix does not match the bare domain
	f("", "10.1.9.9", "")                             // allow_cidrs opens block_private
	f("", "169.254.169.254", "")                      // an allowed single address
	f("", "169.254.1.1", "block_link_local")          // the rest of link-local
	f("", "fe80::1", "block_link_local")              //
	f("", "127.0.0.1", "block_loopback")              //
	f("", "0.0.0.0", "block_loopback")                // the unspecified address reaches the local host
	f("", "::", "block_loopback")                     //
	f("", "172.20.0.1", "block_private")              //
	f("", "100.64.0.1", "block_private")              // carrier-grade NAT
	f("", "fd00::1", "block_private")                 //
	f("", "203.0.113.7", "deny_cidrs")                //
	f("", "::ffff:169.254.1.1", "block_link_local")   // IPv4 written as IPv6
	f("", "224.0.0.1", "multicast")                   //
	f("", "8.8.8.8", "")                              //
	f("VLLM.Internal.", "192.168.1.1", "")            // names compare without case and the root dot
}

// TestDefaults: the default policy refuses link-local only.
func TestDefaults(t *testing.T) {
	p := mustPolicy(t, DefaultConfig())
	for _, a := range []string{"127.0.0.1", "10.0.0.1", "192.168.0.1", "8.8.8.8", "::1"} {
		if err := p.CheckAddr("", netip.MustParseAddr(a)); err != nil {
			t.Fatalf("%s refused by the default policy: %s", a, err)
		}
	}
	err := p.CheckHost("169.254.169.254")
	if err == nil || !strings.Contains(err.Error(), "block_link_local") {
		t.Fatalf("the default policy must refuse the metadata address: %v", err)
	}
	if err := p.CheckHost("[fe80::a9fe:a9fe]"); err == nil {
		t.Fatal("the default policy must refuse IPv6 link-local")
	}
	if err := p.CheckHost("metadata.google.internal"); err != nil {
		t.Fatalf("a name is checked by its name rules only before DNS: %s", err)
	}
}

func TestNewRefusesBadEntries(t *testing.T) {
	f := func(c Config, want string) {
		t.Helper()
		_, err := New(c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("New(%+v) = %v, want an error mentioning %q", c, err, want)
		}
	}
	f(Config{AllowCIDRs: []string{"10.0.0.0/33"}}, `allow_cidrs entry "10.0.0.0/33"`)
	f(Config{DenyCIDRs: []string{"nope"}}, `deny_cidrs entry "nope"`)
	f(Config{AllowHosts: []string{"10.0.0.1"}}, "belongs in allow_cidrs")
	f(Config{DenyHosts: []string{"a*b.com"}}, `deny_hosts entry "a*b.com"`)
	f(Config{DenyHosts: []string{""}}, "deny_hosts")
}

// fakeResolver answers from a table that tests change between lookups.
type fakeResolver struct {
	mu    sync.Mutex
	table map[string][]netip.Addr
	calls int
}

func (r *fakeResolver) set(host string, addrs ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	r.table[host] = as
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	as, ok := r.table[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return as, nil
}

// TestDialerChecksWhatItConnects: the dialer connects to the address it checked; a name that starts
// resolving to a refused address (DNS rebinding) is refused, and the refusal is reported.
func TestDialerChecksWhatItConnects(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	res := &fakeResolver{table: map[string][]netip.Addr{}}
	var refused []string
	d := &Dialer{Policy: mustPolicy(t, DefaultConfig()), Resolver: res, OnRefuse: func(r *Refusal) { refused = append(refused, r.Rule) }}

	res.set("engine.test", "127.0.0.1")
	c, err := d.Dial("engine.test:"+port, time.Second)
	if err != nil {
		t.Fatalf("allowed name: %s", err)
	}
	if got := c.RemoteAddr().String(); got != "127.0.0.1:"+port {
		t.Fatalf("connected to %s", got)
	}
	c.Close()

	res.set("engine.test", "169.254.169.254")
	_, err = d.Dial("engine.test:"+port, time.Second)
	var r *Refusal
	if !errors.As(err, &r) || !strings.Contains(r.Rule, "block_link_local") || r.Host != "engine.test" {
		t.Fatalf("rebound name: %v, want a block_link_local refusal", err)
	}
	if len(refused) != 1 {
		t.Fatalf("OnRefuse called %d times, want 1", len(refused))
	}

	// Mixed answers: only the allowed address is dialled.
	res.set("engine.test", "169.254.169.254", "127.0.0.1")
	if c, err = d.Dial("engine.test:"+port, time.Second); err != nil {
		t.Fatalf("mixed answer: %s", err)
	}
	if got := c.RemoteAddr().String(); got != "127.0.0.1:"+port {
		t.Fatalf("connected to %s, want the allowed address", got)
	}
	c.Close()

	if _, err := d.Dial("169.254.169.254:80", time.Second); !errors.As(err, &r) {
		t.Fatalf("IP literal: %v", err)
	}
	if _, err := d.Dial("nowhere.test:80", time.Second); err == nil || errors.As(err, &r) {
		t.Fatalf("unknown name: %v, want a lookup error", err)
	}
	var nilDialer *Dialer
	if c, err := nilDialer.Dial(ln.Addr().String(), time.Second); err != nil {
		t.Fatalf("nil dialer: %s", err)
	} else {
		c.Close()
	}
}
