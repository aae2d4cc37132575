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

// TestDefaults: the default policy refuses cloud metadata and link-local addresses only.
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

// TestDefaultsRefuseMetadata: the well-known metadata addresses outside link-local are refused by the
// default policy (before, only 169.254.0.0/16 and fe80::/10 were), whatever their IPv6 spelling, and stay
// refused with block_link_local off; an allow rule still opens them.
func TestDefaultsRefuseMetadata(t *testing.T) {
	def := mustPolicy(t, DefaultConfig())
	noLL := mustPolicy(t, Config{BlockMetadata: true})
	for _, a := range []string{"fd00:ec2::254", "100.100.100.200", "192.0.0.192", "168.63.129.16", "fd20:ce::254",
		"::ffff:100.100.100.200", "64:ff9b::6464:64c8", "::100.100.100.200"} {
		for _, p := range []*Policy{def, noLL} {
			err := p.CheckHost(a)
			if err == nil || !strings.Contains(err.Error(), "block_metadata") {
				t.Fatalf("%s: %v, want a block_metadata refusal", a, err)
			}
		}
	}
	for _, a := range []string{"169.254.169.254", "169.254.170.2", "169.254.0.23"} {
		if err := noLL.CheckHost(a); err == nil || !strings.Contains(err.Error(), "block_metadata") {
			t.Fatalf("%s with block_link_local off: %v, want a block_metadata refusal", a, err)
		}
	}
	open := mustPolicy(t, Config{BlockMetadata: true, AllowCIDRs: []string{"100.100.100.200"}})
	if err := open.CheckHost("100.100.100.200"); err != nil {
		t.Fatalf("allow_cidrs does not open block_metadata: %s", err)
	}
	if err := mustPolicy(t, Config{}).CheckHost("fd00:ec2::254"); err != nil {
		t.Fatalf("block_metadata off still refuses: %s", err)
	}
}

// TestEmbeddedIPv4: an IPv6 address that carries an IPv4 address (IPv4-compatible, IPv4-mapped,
// IPv4-translated, NAT64 64:ff9b::/96 and 64:ff9b:1::/48) is checked as that IPv4 address: before, the
// strict policy let ::127.0.0.1 and 64:ff9b::7f00:1 through.
func TestEmbeddedIPv4(t *testing.T) {
	strict := mustPolicy(t, Config{BlockMetadata: true, BlockLinkLocal: true, BlockLoopback: true, BlockPrivate: true})
	f := func(p *Policy, addr, wantRule string) {
		t.Helper()
		err := p.CheckHost(addr)
		var r *Refusal
		switch {
		case wantRule == "" && err != nil:
			t.Fatalf("%s: refused (%s), want allowed", addr, err)
		case wantRule != "" && !errors.As(err, &r):
			t.Fatalf("%s: allowed, want refused by %s", addr, wantRule)
		case wantRule != "" && !strings.HasPrefix(r.Rule, wantRule):
			t.Fatalf("%s: refused by %q, want %s", addr, r.Rule, wantRule)
		}
	}
	f(strict, "::127.0.0.1", "block_loopback")            // IPv4-compatible
	f(strict, "64:ff9b::7f00:1", "block_loopback")        // NAT64 well-known prefix
	f(strict, "64:ff9b::127.0.0.1", "block_loopback")     //
	f(strict, "64:ff9b:1::7f00:1", "block_loopback")      // NAT64 local-use prefix, /96 layout
	f(strict, "64:ff9b:1:7f00:0:100::", "block_loopback") // and /48 layout
	f(strict, "::ffff:127.0.0.1", "block_loopback")       // IPv4-mapped
	f(strict, "::ffff:0:7f00:1", "block_loopback")        // IPv4-translated
	f(strict, "::10.0.0.1", "block_private")              //
	f(strict, "64:ff9b::a00:1", "block_private")          //
	f(strict, "64:ff9b::c0a8:101", "block_private")       // 192.168.1.1
	f(strict, "64:ff9b::a9fe:a9fe", "block_link_local")   // 169.254.169.254
	f(strict, "::169.254.1.1", "block_link_local")        //
	f(strict, "64:ff9b::808:808", "")                     // 8.8.8.8 through NAT64 is fine
	f(strict, "::", "block_loopback")                     // IPv6's own unspecified and loopback
	f(strict, "::1", "block_loopback")                    //
	deny := mustPolicy(t, Config{DenyCIDRs: []string{"203.0.113.0/24"}})
	f(deny, "64:ff9b::cb00:7107", "deny_cidrs") // deny_cidrs too
	nat := mustPolicy(t, Config{BlockPrivate: true, AllowCIDRs: []string{"64:ff9b::a00:0/120"}})
	f(nat, "64:ff9b::a00:1", "")                // an allow rule on the IPv6 form itself opens it
	f(nat, "64:ff9b::a00:101", "block_private") //
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
	f(Config{KVBindPorts: []int{0}}, "kv_bind_ports entry 0")
	f(Config{KVBindPorts: []int{65536}}, "kv_bind_ports entry 65536")
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
