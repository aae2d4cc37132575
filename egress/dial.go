package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// Resolver looks names up; net.DefaultResolver is one. Tests inject their own.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer connects to "host:port" under a policy: it resolves the host once, checks every address it gets,
// and connects to the first one the policy allows (trying the next allowed one if that connection fails).
// The connection goes to the address that was checked. A host none of whose addresses is allowed is
// refused with the *Refusal of its first address, and OnRefuse is told.
//
// A nil *Dialer dials without a policy. Safe for concurrent use.
type Dialer struct {
	Policy   *Policy
	Resolver Resolver // nil: net.DefaultResolver
	// OnRefuse, when set, is called for every refused connection (to log and count it).
	OnRefuse func(r *Refusal)
}

// DialContext connects to addr ("host:port") over network ("tcp", "tcp4" or "tcp6").
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var nd net.Dialer
	if d == nil || d.Policy == nil {
		return nd.DialContext(ctx, network, addr)
	}
	addrs, host, port, err := d.Resolve(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	var last error
	for _, a := range addrs {
		c, err := nd.DialContext(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		last = err
	}
	return nil, fmt.Errorf("cannot connect to %s: %w", host, last)
}

// Dial is DialContext with a timeout, in the shape fasthttp's DialTimeout takes.
func (d *Dialer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return d.DialContext(ctx, "tcp", addr)
}

// Resolve returns the addresses of addr's host that the policy allows, in the resolver's order, with the
// host and port. It is what DialContext connects to; callers that hand an address to another library (a
// ZMQ endpoint) use it to pass the checked address instead of the name.
func (d *Dialer) Resolve(ctx context.Context, network, addr string) (allowed []netip.Addr, host, port string, err error) {
	host, port, err = net.SplitHostPort(addr)
	if err != nil {
		return nil, "", "", fmt.Errorf("cannot dial %q: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, "", "", fmt.Errorf("cannot dial %q: bad port", addr)
	}
	var addrs []netip.Addr
	name := ""
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		name = host
		if r := d.Policy.CheckHost(host); r != nil {
			d.refused(r)
			return nil, host, port, r
		}
		res := d.Resolver
		if res == nil {
			res = net.DefaultResolver
		}
		ipNet := "ip"
		switch network {
		case "tcp4":
			ipNet = "ip4"
		case "tcp6":
			ipNet = "ip6"
		}
		if addrs, err = res.LookupNetIP(ctx, ipNet, host); err != nil {
			return nil, host, port, fmt.Errorf("cannot resolve %s: %w", host, err)
		}
	}
	var first error
	for _, a := range addrs {
		if err := d.Policy.CheckAddr(name, a); err != nil {
			if first == nil {
				first = err
			}
			continue
		}
		allowed = append(allowed, a.Unmap())
	}
	if len(allowed) == 0 {
		if first == nil {
			first = fmt.Errorf("cannot resolve %s: no address", host)
		}
		var r *Refusal
		if errors.As(first, &r) {
			d.refused(r)
		}
		return nil, host, port, first
	}
	return allowed, host, port, nil
}

func (d *Dialer) refused(r error) {
	var ref *Refusal
	if d.OnRefuse != nil && errors.As(r, &ref) {
		d.OnRefuse(ref)
	}
}
