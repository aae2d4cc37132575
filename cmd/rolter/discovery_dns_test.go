package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/dnstest"
	"github.com/rolter-ai/rolter/internal/netns"
)

// dnsSourceConfig is a gateway config whose route m takes its targets from source "vllm" of kind dns:
// record of name, asked of resolver.
func dnsSourceConfig(resolver, record, name string) string {
	return fmt.Sprintf(`[server]
listen = "127.0.0.1:0"
[[sources]]
name = "vllm"
kind = "dns"
port = %d
settle_secs = 0.2
[sources.dns]
name = %q
record = %q
resolver = %q
min_ttl_secs = 0.2
max_ttl_secs = 1
[sources.provider]
api_base = "http://{ip}:{port}"
[[routes]]
model = "m"
strategy = "cache_aware"
[routes.params]
overload_margin = 16
[[routes.targets]]
source = "vllm"
`, enginePort, name, record, resolver)
}

// hostsOf is a hosts file giving name the addresses of the netns indexes idx.
func hostsOf(name string, idx ...int) string {
	var b strings.Builder
	for _, i := range idx {
		fmt.Fprintf(&b, "%s %s\n", netns.Addr(i), name)
	}
	return b.String()
}

// TestDiscoveryDNS: the gateway follows the A records, then the SRV records, that a real DNS server
// (dnsmasq) serves and the test changes, under a bounded load: no request fails, new engines take
// traffic within 2 s, the repeated prompt's engine keeps its prefix_hit, and a DNS server that goes
// away leaves the last set serving.
func TestDiscoveryDNS(t *testing.T) {
	if !netns.Run(t) {
		return
	}
	t.Run("A", func(t *testing.T) {
		d := dnstest.Start(t, "", hostsOf("vllm.test", 1, 2))
		r := newRig(t, 4, dnsSourceConfig(d.Addr(), "a", "vllm.test"))
		r.waitTargets("at start", 1, 2)
		r.load(4)
		rp := r.remember()
		changed := time.Now()
		d.SetHosts(hostsOf("vllm.test", 1, 2, 3, 4))
		r.grown("2 -> 4", changed, rp, []int{3, 4}, []int{1, 2, 3, 4})
		gone := 1
		if rp.h == 1 {
			gone = 2
		}
		keep := except(4, gone)
		d.SetHosts(hostsOf("vllm.test", keep...))
		r.waitTargets("4 -> 3", keep...)
		r.prefixHit("right after 4 -> 3", rp.prompt, rp.home)

		d.Stop()
		time.Sleep(1500 * time.Millisecond) // past the TTL: the source asks, fails, keeps its set
		r.waitTargets("with the DNS server down", keep...)
		if st := r.gw.fleet.Status(); len(st) != 1 || st[0].Up || st[0].LastError == "" {
			t.Fatalf("with the DNS server down the source's status is %+v", st)
		}
		r.prefixHit("with the DNS server down", rp.prompt, rp.home)
		r.noneFailed()
	})
	t.Run("SRV", func(t *testing.T) {
		srv := func(idx ...int) string {
			var b strings.Builder
			for _, i := range idx {
				fmt.Fprintf(&b, "srv-host=_http._tcp.vllm.test,e%d.test,%d,0,10\n", i, enginePort)
			}
			return b.String()
		}
		hosts := ""
		for i := 1; i <= 3; i++ {
			hosts += hostsOf(fmt.Sprintf("e%d.test", i), i)
		}
		d := dnstest.Start(t, srv(1, 2), hosts)
		r := newRig(t, 3, dnsSourceConfig(d.Addr(), "srv", "_http._tcp.vllm.test"))
		r.waitTargets("at start", 1, 2)
		r.load(4)
		rp := r.remember()
		changed := time.Now()
		d.Restart(srv(1, 2, 3))
		r.grown("2 -> 3", changed, rp, []int{3}, []int{1, 2, 3})
		r.noneFailed()
	})
}
