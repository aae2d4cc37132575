package control

import (
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// The control plane is reached by browsers (the dashboard), so it is also reachable by every page a browser
// of the operator opens. Three checks keep those pages out, for the API and the dashboard alike:
//
//   - Host: only the control plane's own names are answered (421 otherwise). A page whose DNS name an
//     attacker re-points at the gateway (DNS rebinding) is same-origin with itself, so Origin checks cannot
//     see it; its requests carry its own name in Host.
//   - Origin and Sec-Fetch-Site: a request a page of another origin sent is refused (403). Browsers send
//     Origin with every cross-origin fetch and every form POST; Sec-Fetch-Site covers the writes that come
//     without one.
//   - Content-Type: a write's body must be application/json (415). A form or a fetch with a "simple"
//     content type (text/plain, form-encoded, multipart) goes out without a CORS preflight; JSON does not.
//
// Clients that are not browsers (curl, SDKs) send no Origin and no Sec-Fetch-Site, and pass.

// hostSet is the names the control plane answers to in the Host header.
type hostSet struct {
	port  string          // the listen port; names match only with it ("0": the port is not known, any)
	names map[string]bool // lower case, IPv6 without brackets
	anyIP bool            // listening on every interface: any IP address is the control plane's own
	extra map[string]bool // [control] hosts: "name" (any port) or "name:port", lower case
}

// newHostSet returns the names of a control plane listening on listen, plus the operator's hosts.
func newHostSet(listen string, hosts []string) *hostSet {
	s := &hostSet{names: map[string]bool{}, extra: map[string]bool{}}
	host, port, err := net.SplitHostPort(listen)
	if err == nil {
		s.port = port
		h := strings.ToLower(host)
		a, aerr := netip.ParseAddr(h)
		switch {
		case h == "" || aerr == nil && a.IsUnspecified():
			s.anyIP = true
			s.names["localhost"] = true
		case isLoopback(listen):
			s.names["localhost"], s.names["127.0.0.1"], s.names["::1"] = true, true, true
		}
		if h != "" {
			s.names[h] = true
		}
	}
	for _, h := range hosts {
		s.extra[strings.ToLower(h)] = true
	}
	return s
}

// allows reports whether host, a Host header (or an Origin's host), names this control plane.
func (s *hostSet) allows(host string) bool {
	h := strings.ToLower(host)
	name, port, err := net.SplitHostPort(h)
	if err != nil {
		name, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), ""
	}
	if s.extra[h] || s.extra[name] {
		return true
	}
	if port != s.port && s.port != "0" && !(port == "" && s.port == "80") {
		return false
	}
	if s.names[name] {
		return true
	}
	_, err = netip.ParseAddr(name)
	return s.anyIP && err == nil
}

// guard runs the checks above before next.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.hosts.allows(r.Host) {
			w.Header().Set("Cache-Control", "no-store")
			// The answer repeats no request bytes: the name is the client's, and the page's that sent it.
			s.writeError(w, r, errorf(http.StatusMisdirectedRequest, "misdirected_request",
				"this control plane does not answer to the name in the Host header; add it to [control] hosts if it is one of its names"))
			return
		}
		if err := sameOrigin(r); err != nil {
			w.Header().Set("Cache-Control", "no-store")
			s.writeError(w, r, err)
			return
		}
		if err := jsonBody(r); err != nil {
			w.Header().Set("Cache-Control", "no-store")
			s.writeError(w, r, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameOrigin refuses a request a page of another origin sent: an Origin that is not this Host's (the
// scheme may differ: a TLS proxy in front), and a write a browser marks as from another site.
func sameOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" || !strings.EqualFold(u.Host, r.Host) {
			return errorf(http.StatusForbidden, "cross_origin", "cannot serve a request from another origin: the control plane answers its own origin only")
		}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	// same-site is another origin too: another port of the same host, or a sibling subdomain.
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return errorf(http.StatusForbidden, "cross_origin", "cannot serve a %s request from another site (Sec-Fetch-Site %q)", r.Method, site)
	}
	return nil
}

// jsonBody refuses a write whose body, or announced content type, is not application/json.
func jsonBody(r *http.Request) error {
	switch r.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return nil
	}
	ct := r.Header.Get("Content-Type")
	if ct == "" && r.ContentLength == 0 {
		return nil // no body
	}
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return errorf(http.StatusUnsupportedMediaType, "unsupported_media_type", "cannot read a %s body that is not application/json", r.Method)
	}
	return nil
}
