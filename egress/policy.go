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
//  5. the address is link-local (169.254.0.0/16, fe80::/10: cloud metadata lives there) and block_link_local
//     is on [default], or loopback (127.0.0.0/8, ::1, and the unspecified 0.0.0.0 and ::, which connect to
//     the local host) and block_loopback is on, or private (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16,
//     100.64.0.0/10, fc00::/7) and block_private is on: refused.
//  6. otherwise allowed.
//
// Deny beats allow; allow lists open holes in the block_* categories, never in the deny lists. Multicast
// and broadcast addresses are always refused: nothing the gateway dials lives there. An IPv4 address
// written as IPv6 (::ffff:169.254.169.254) is checked as the IPv4 address.
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
	BlockLinkLocal bool     `toml:"block_link_local" json:"block_link_local"`
	BlockLoopback  bool     `toml:"block_loopback" json:"block_loopback"`
	BlockPrivate   bool     `toml:"block_private" json:"block_private"`
	AllowHosts     []string `toml:"allow_hosts" json:"allow_hosts"`
	DenyHosts      []string `toml:"deny_hosts" json:"deny_hosts"`
	AllowCIDRs     []string `toml:"allow_cidrs" json:"allow_cidrs"`
	DenyCIDRs      []string `toml:"deny_cidrs" json:"deny_cidrs"`
}

// DefaultConfig is the policy of a config without [egress]: link-local addresses refused, nothing else.
func DefaultConfig() Config { return Config{BlockLinkLocal: true} }

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
	refuse := func(rule string) error { return &Refusal{Host: host, Addr: a, Rule: rule} }
	lower := strings.ToLower(strings.TrimSuffix(name, "."))
	if name != "" {
		for _, h := range p.denyHosts {
			if h.match(lower) {
				return &Refusal{Host: host, Rule: "deny_hosts " + h.String()}
			}
		}
	}
	for _, pr := range p.denyCIDRs {
		if pr.Contains(a) {
			return refuse("deny_cidrs " + pr.String())
		}
	}
	if a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return refuse("multicast and broadcast addresses are never dialled")
	}
	if name != "" {
		for _, h := range p.allowHosts {
			if h.match(lower) {
				return nil
			}
		}
	}
	for _, pr := range p.allowCIDRs {
		if pr.Contains(a) {
			return nil
		}
	}
	switch {
	case p.cfg.BlockLinkLocal && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()):
		return refuse("block_link_local (169.254.0.0/16, fe80::/10: cloud metadata services live there)")
	case p.cfg.BlockLoopback && (a.IsLoopback() || a.IsUnspecified()):
		return refuse("block_loopback")
	case p.cfg.BlockPrivate && (a.IsPrivate() || cgnat.Contains(a)):
		return refuse("block_private")
	}
	return nil
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
