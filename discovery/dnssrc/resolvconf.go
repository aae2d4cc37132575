package dnssrc

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
)

// maxResolvConfLines bounds how much of a resolv.conf is read looking for a nameserver.
const maxResolvConfLines = 1000

// firstNameserver returns the first `nameserver` of the resolv.conf at path as "host:53", the way the C
// library's resolver tries it first.
func firstNameserver(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("cannot read the resolver from %s: %w", path, err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for n := 0; n < maxResolvConfLines && s.Scan(); n++ {
		if a, ok := nameserverLine(s.Text()); ok {
			return net.JoinHostPort(a.String(), "53"), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("cannot read the resolver from %s: %w", path, err)
	}
	return "", fmt.Errorf("cannot find a nameserver in %s", path)
}

// nameserverLine parses "nameserver <address>", the only resolv.conf line a Watcher needs.
func nameserverLine(line string) (netip.Addr, bool) {
	f := strings.Fields(line)
	if len(f) < 2 || f[0] != "nameserver" {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(f[1])
	return a, err == nil
}
