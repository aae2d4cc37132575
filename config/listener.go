package config

import (
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// selfListener is one of the gateway's own listening addresses, host (possibly empty: every address) and
// port, as the config names it.
type selfListener struct {
	key, addr, host, port string
}

// ownListeners returns the listeners of cfg: the data plane's, and the control plane's when it is on. A
// listener on port 0 (a port picked at start) cannot be known here.
func ownListeners(cfg *Config) []selfListener {
	var out []selfListener
	add := func(key, addr string) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return
		}
		if n, err := net.LookupPort("tcp", port); err == nil && n != 0 {
			out = append(out, selfListener{key: key, addr: addr, host: host, port: strconv.Itoa(n)})
		}
	}
	add("server.listen", cfg.Server.Listen)
	if cfg.Control.Enabled {
		add("control.listen", cfg.Control.Listen)
	}
	return out
}

// notSelfURL checks that the http(s) URL raw is none of the gateway's own listeners.
func (v *validator) notSelfURL(key, raw string) {
	u, err := url.Parse(raw)
	if err != nil {
		return
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	v.notSelf(key, raw, u.Hostname(), port)
}

// notSelf refuses an endpoint (named by raw in the message) at host and port that is one of the gateway's
// listeners: a provider pointing at the gateway makes every request it routes there come back to it.
// Names other than localhost are not resolved (the check runs without DNS); the hop header stops the loops
// of those at the first request (engine/loop.go).
func (v *validator) notSelf(key, raw, host, port string) {
	n, err := net.LookupPort("tcp", port)
	if err != nil {
		return
	}
	for _, l := range v.self {
		if l.port == strconv.Itoa(n) && l.reaches(host) {
			v.addf(key, "cannot use %q: it is the gateway's own listener (%s %q), which would route the requests back to itself", raw, l.key, l.addr)
			return
		}
	}
}

// reaches reports whether connecting to host (on the listener's port) reaches the listener: the host it
// names, a loopback or unspecified address (or localhost) for a listener on every address or on loopback,
// and any address of this host's interfaces for a listener on every address.
func (l selfListener) reaches(host string) bool {
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if host == "*" {
		host = "0.0.0.0" // ZMQ's every-address bind
	}
	la, lerr := netip.ParseAddr(l.host)
	everywhere := l.host == "" || l.host == "*" || (lerr == nil && la.IsUnspecified())
	onLoopback := isLocalhostName(l.host) || (lerr == nil && la.IsLoopback())
	if l.host != "" && strings.EqualFold(host, l.host) {
		return true
	}
	if isLocalhostName(host) {
		return everywhere || onLoopback
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return false
	}
	a = a.Unmap().WithZone("")
	switch {
	case a.IsLoopback() || a.IsUnspecified():
		return everywhere || onLoopback
	case lerr == nil && a == la.Unmap().WithZone(""):
		return true
	}
	return everywhere && slices.Contains(localAddrs(), a)
}

// isLocalhostName reports whether name is localhost or a name under it, loopback by definition (RFC 6761).
func isLocalhostName(name string) bool {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	return name == "localhost" || strings.HasSuffix(name, ".localhost")
}

// localAddrs are the addresses of this host's interfaces, read once.
var localAddrs = sync.OnceValue(func() []netip.Addr {
	var out []netip.Addr
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range as {
		if pn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(pn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
})
