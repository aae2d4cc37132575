// Package egress is the gateway's egress policy: which addresses it may connect to. Operators (and API
// users) type the endpoints it dials - engines, their /metrics, LMCache status endpoints, KV-event
// publishers - so without a policy the gateway could be pointed at a cloud metadata service or an internal
// admin port.
//
// Order of evaluation, for a destination host (a name or an IP literal) and each address it resolves to;
// the first rule that matches decides:
//
//  1. deny_hosts matches the name: refused.
//  2. deny_cidrs contains the address: refused.
//  3. allow_hosts matches the name: allowed.
//  4. allow_cidrs contains the address: allowed.
//  5. the address is link-local (169.254.0.0/16, fe80::/10: cloud metadata lives there) and
//     block_link_local is on [default], or a cloud metadata service's (metadataAddrs) and block_metadata
//     is on [default], or loopback (127.0.0.0/8, ::1, and the unspecified 0.0.0.0 and ::, which connect to
//     the local host) and block_loopback is on, or private (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
//     100.64.0.0/10, fc00::/7) and block_private is on: refused.
//  6. otherwise allowed.
//
// Deny beats allow; allow lists open holes in the block_* categories, never in the deny lists. Multicast
// and broadcast addresses are always refused: nothing the gateway dials lives there. An IPv4 address
// written as IPv6 is checked as the IPv4 address: IPv4-mapped (::ffff:169.254.169.254), IPv4-compatible
// (::127.0.0.1), IPv4-translated (::ffff:0:a.b.c.d) and NAT64 (64:ff9b::/96, 64:ff9b:1::/48), whose
// translator would connect to the IPv4 address on the gateway's behalf. Only an allow rule naming the IPv6
// form itself lets such an address through without the IPv4 address's check.
//
// A name is checked twice: its name rules when the config loads (no DNS then), and every address DNS
// returns at connect time, by Dialer, which then connects to the address it checked - there is no second
// lookup between check and connect, so a name that starts resolving to a refused address (DNS rebinding)
// is refused.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Config is the [egress] section of rolter.toml.
type Config struct {
	BlockMetadata  bool     `toml:"block_metadata" json:"block_metadata"`
	BlockLinkLocal bool     `toml:"block_link_local" json:"block_link_local"`
	BlockLoopback  bool     `toml:"block_loopback" json:"block_loopback"`
	BlockPrivate   bool     `toml:"block_private" json:"block_private"`
	AllowHosts     []string `toml:"allow_hosts" json:"allow_hosts"`
	DenyHosts      []string `toml:"deny_hosts" json:"deny_hosts"`
	AllowCIDRs     []string `toml:"allow_cidrs" json:"allow_cidrs"`
	DenyCIDRs      []string `toml:"deny_cidrs" json:"deny_cidrs"`
	// KVBindPorts are the ports an org's provider (made through the control plane) may bind a KV-event
	// socket on (kv_events mode "bind"); empty: an org's provider cannot bind. The file's providers bind
	// where the operator says.
	KVBindPorts []int `toml:"kv_bind_ports" json:"kv_bind_ports"`
}

// DefaultConfig is the policy of a config without [egress]: cloud metadata and link-local addresses
// refused, nothing else.
func DefaultConfig() Config { return Config{BlockMetadata: true, BlockLinkLocal: true} }

// metadataAddrs are the cloud metadata (and platform agent) services at fixed addresses, refused by
// block_metadata. Those in 169.254.0.0/16 are link-local too, listed so that turning block_link_local off
// keeps them refused.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OCI, OpenStack, DigitalOcean, Hetzner, ... IMDS
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata and credentials
	netip.MustParseAddr("169.254.0.23"),    // Tencent Cloud metadata
	netip.MustParseAddr("fd00:ec2::254"),   // AWS IMDS over IPv6 (Nitro)
	netip.MustParseAddr("fd20:ce::254"),    // GCP metadata server over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud metadata
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud metadata
	netip.MustParseAddr("168.63.129.16"),   // Azure WireServer (platform agent, host's certificates)
}

func isMetadata(a netip.Addr) bool {
	for _, m := range metadataAddrs {
		if a == m {
			return true
		}
	}
	return false
}

// Policy decides which addresses the gateway may connect to. It is immutable and safe for concurrent use.
type Policy struct {
	cfg                   Config
	allowHosts, denyHosts []hostPattern
	allowCIDRs, denyCIDRs []netip.Prefix
}

// hostPattern is an exact name, or a suffix for "*.example.com" (which matches a.example.com and
// a.b.example.com, not example.com itself).
type hostPattern struct {
	name   string
	suffix bool
}

func (h hostPattern) match(name string) bool {
	if h.suffix {
		return strings.HasSuffix(name, h.name)
	}
	return name == h.name
}

func (h hostPattern) String() string {
	if h.suffix {
		return "*" + h.name
	}
	return h.name
}

// New checks cfg and builds its policy. Errors name the list and the entry at fault.
func New(cfg Config) (*Policy, error) {
	p := &Policy{cfg: cfg}
	var errs []error
	hosts := func(key string, list []string) []hostPattern {
		var out []hostPattern
		for _, h := range list {
			pat, err := parseHostPattern(h)
			if err != nil {
				errs = append(errs, fmt.Errorf("cannot use %s entry %q: %w", key, h, err))
				continue
			}
			out = append(out, pat)
		}
		return out
	}
	cidrs := func(key string, list []string) []netip.Prefix {
		var out []netip.Prefix
		for _, c := range list {
			pr, err := parseCIDR(c)
			if err != nil {
				errs = append(errs, fmt.Errorf("cannot use %s entry %q: %w", key, c, err))
				continue
			}
			out = append(out, pr)
		}
		return out
	}
	p.allowHosts = hosts("allow_hosts", cfg.AllowHosts)
	p.denyHosts = hosts("deny_hosts", cfg.DenyHosts)
	p.allowCIDRs = cidrs("allow_cidrs", cfg.AllowCIDRs)
	p.denyCIDRs = cidrs("deny_cidrs", cfg.DenyCIDRs)
	for _, port := range cfg.KVBindPorts {
		if port < 1 || port > 65535 {
			errs = append(errs, fmt.Errorf("cannot use kv_bind_ports entry %d: want a port between 1 and 65535", port))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func parseHostPattern(s string) (hostPattern, error) {
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	suffix := false
	if strings.HasPrefix(name, "*.") {
		name, suffix = name[1:], true // keep the dot: ".example.com"
	}
	check := strings.TrimPrefix(name, ".")
	if check == "" || strings.ContainsAny(check, "*/:[] ") {
		return hostPattern{}, errors.New("want a host name or *.suffix")
	}
	if _, err := netip.ParseAddr(check); err == nil {
		return hostPattern{}, errors.New("an address belongs in allow_cidrs or deny_cidrs")
	}
	return hostPattern{name: name, suffix: suffix}, nil
}

// parseCIDR takes a prefix ("10.0.0.0/8") or a single address ("10.1.2.3", a /32 or /128).
func parseCIDR(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, errors.New("want an address or a prefix such as 10.0.0.0/8")
		}
		if a := pr.Addr(); a.Is4In6() && pr.Bits() >= 96 {
			pr = netip.PrefixFrom(a.Unmap(), pr.Bits()-96)
		}
		return pr.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, errors.New("want an address or a prefix such as 10.0.0.0/8")
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Refusal is the error of a destination the policy refuses: the host asked for, the address (when the
// refusal is about one) and the rule that decided.
type Refusal struct {
	Host string
	Addr netip.Addr // invalid when a name rule decided
	Rule string
}

func (r *Refusal) Error() string {
	if r.Addr.IsValid() && r.Host != r.Addr.String() {
		return fmt.Sprintf("egress policy refuses %s (%s): %s", r.Host, r.Addr, r.Rule)
	}
	if r.Addr.IsValid() {
		return fmt.Sprintf("egress policy refuses %s: %s", r.Addr, r.Rule)
	}
	return fmt.Sprintf("egress policy refuses %s: %s", r.Host, r.Rule)
}

// CheckHost checks a host as the config names it, before any lookup: an IP literal completely, a name by
// the name rules only (deny_hosts). It returns nil or a *Refusal.
func (p *Policy) CheckHost(host string) error {
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr("", a)
	}
	name := strings.ToLower(host)
	for _, h := range p.denyHosts {
		if h.match(name) {
			return &Refusal{Host: host, Rule: "deny_hosts " + h.String()}
		}
	}
	return nil
}

// CheckAddr decides for address a, reached through name (empty for an IP literal). It returns nil or a
// *Refusal.
func (p *Policy) CheckAddr(name string, a netip.Addr) error {
	a = a.Unmap().WithZone("")
	host := name
	if host == "" {
		host = a.String()
	}
	lower := strings.ToLower(strings.TrimSuffix(name, "."))
	if name != "" {
		for _, h := range p.denyHosts {
			if h.match(lower) {
				return &Refusal{Host: host, Rule: "deny_hosts " + h.String()}
			}
		}
	}
	rule, allowed := p.decide(lower, a)
	if rule == "" && !allowed {
		// The IPv6 form is no allow rule's: the IPv4 address it reaches decides.
		v4s, n := embeddedIPv4(a)
		for _, v4 := range v4s[:n] {
			if r, _ := p.decide(lower, v4); r != "" {
				rule = r + " (IPv4 " + v4.String() + " embedded in IPv6)"
				break
			}
		}
	}
	if rule != "" {
		return &Refusal{Host: host, Addr: a, Rule: rule}
	}
	return nil
}

// decide applies the address rules (deny_cidrs, allow_hosts with lower, allow_cidrs, the block_*
// categories) to a: the refusing rule, or "" and whether an allow rule let it through.
func (p *Policy) decide(lower string, a netip.Addr) (rule string, allowed bool) {
	for _, pr := range p.denyCIDRs {
		if pr.Contains(a) {
			return "deny_cidrs " + pr.String(), false
		}
	}
	if a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "multicast and broadcast addresses are never dialled", false
	}
	if lower != "" {
		for _, h := range p.allowHosts {
			if h.match(lower) {
				return "", true
			}
		}
	}
	for _, pr := range p.allowCIDRs {
		if pr.Contains(a) {
			return "", true
		}
	}
	switch {
	case p.cfg.BlockLinkLocal && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()):
		return "block_link_local (169.254.0.0/16, fe80::/10: cloud metadata services live there)", false
	case p.cfg.BlockMetadata && isMetadata(a):
		return "block_metadata (a cloud metadata service)", false
	case p.cfg.BlockLoopback && (a.IsLoopback() || a.IsUnspecified()):
		return "block_loopback", false
	case p.cfg.BlockPrivate && (a.IsPrivate() || cgnat.Contains(a)):
		return "block_private", false
	}
	return "", false
}

// IPv6 prefixes that carry an IPv4 address in their last 32 bits (RFC 4291 IPv4-compatible, RFC 6145
// IPv4-translated, RFC 6052 and RFC 8215 NAT64).
var (
	v4Compatible = netip.MustParsePrefix("::/96")
	v4Translated = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64        = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local   = netip.MustParsePrefix("64:ff9b:1::/48")
)

// embeddedIPv4 returns the IPv4 addresses an IPv6 address a may stand for (IPv4-mapped addresses are
// unmapped before): none, or the last 32 bits; in 64:ff9b:1::/48, whose NAT64 prefix length the operator
// picks, also the RFC 6052 layout of a /48 prefix (bits 48-63 and 72-87).
func embeddedIPv4(a netip.Addr) (out [2]netip.Addr, n int) {
	if !a.Is6() {
		return out, 0
	}
	b := a.As16()
	last := netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	switch {
	case v4Compatible.Contains(a):
		// :: and ::1 are IPv6's own unspecified and loopback addresses.
		if a.IsUnspecified() || a.IsLoopback() {
			return out, 0
		}
		out[0], n = last, 1
	case v4Translated.Contains(a), nat64.Contains(a):
		out[0], n = last, 1
	case nat64Local.Contains(a):
		out[0], out[1], n = last, netip.AddrFrom4([4]byte{b[6], b[7], b[9], b[10]}), 2
	}
	return out, n
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598), private in practice.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// SplitHostPort splits "host:port" (or "[v6]:port") for CheckHost; a missing port is allowed.
func SplitHostPort(hostport string) (host, port string) {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return strings.Trim(hostport, "[]"), ""
	}
	return h, p
}
