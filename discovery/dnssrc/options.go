package dnssrc

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
)

// Options are what a Watcher takes from the gateway rather than from the source's config.
type Options struct {
	// Dial reaches the DNS server ("udp" first, "tcp" for a truncated answer); the gateway passes its
	// egress dialer, so the resolver's address is under the egress policy too. nil is a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Check is the egress policy's CheckAddr: an answer's address it refuses is left out of the set and
	// logged, which is not a failure of the source. name is the host the address is of (the source's
	// name, or an SRV target). nil allows every address.
	Check func(name string, a netip.Addr) error
	// Logger logs refused addresses and failed resolutions; nil is slog.Default().
	Logger *slog.Logger
	// ResolvConf is where an empty resolver is looked up; "" is /etc/resolv.conf. Tests set it.
	ResolvConf string
}

const defaultResolvConf = "/etc/resolv.conf"

// dialer returns o.Dial, or a net.Dialer's when o has none.
func (o Options) dialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.Dial != nil {
		return o.Dial
	}
	var d net.Dialer
	return d.DialContext
}

// checker returns o.Check, or one that allows every address.
func (o Options) checker() func(name string, a netip.Addr) error {
	if o.Check != nil {
		return o.Check
	}
	return func(string, netip.Addr) error { return nil }
}

// logger returns o.Logger, or slog.Default().
func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}

// resolvConf returns o.ResolvConf, or /etc/resolv.conf.
func (o Options) resolvConf() string {
	if o.ResolvConf != "" {
		return o.ResolvConf
	}
	return defaultResolvConf
}
