package loadtest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// CheckLoopback returns an error unless rawURL is an http(s) URL whose host is a loopback
// address (127.0.0.0/8, ::1) or "localhost". Names are not resolved: a load test aimed at
// "my-gateway.internal" is refused even if it resolves to 127.0.0.1, because the name could
// resolve elsewhere tomorrow. Options.AllowRemote turns the check off.
func CheckLoopback(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("cannot parse URL %q: %w", rawURL, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL %q must start with http:// or https://", rawURL)
	}
	host := u.Hostname()
	if host == "" {
		return fmt.Errorf("URL %q has no host", rawURL)
	}
	if strings.EqualFold(host, "localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("refusing to load-test %q: the host is not a loopback address (allow it explicitly with -allow-remote / Options.AllowRemote)", rawURL)
}
