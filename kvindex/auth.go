package kvindex

import (
	"crypto/ecdh"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// This file holds the publisher policy of bind-mode targets (SubscriberConfig.AllowedPublishers and CURVE)
// and the ZAP 1.0 protocol (ZMQ RFC 27) that libzmq uses to ask it about each connection. It is pure Go:
// the cgo handler (zap.go) only moves frames between libzmq and authorizer.answer, so the parsing and the
// decisions are tested in every build.

// curveKeyLen is the length of a CURVE key (Curve25519), raw; its Z85 text is z85KeyLen characters.
const (
	curveKeyLen = 32
	z85KeyLen   = 40
)

// z85Alphabet is the Z85 encoding's alphabet (ZMQ RFC 32), in digit order.
const z85Alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

// z85Digits maps a byte to its Z85 digit plus one (0: not in the alphabet).
var z85Digits = func() (d [256]byte) {
	for i := 0; i < len(z85Alphabet); i++ {
		d[z85Alphabet[i]] = byte(i + 1)
	}
	return d
}()

// decodeCurveKey decodes a 40-character Z85 CURVE key. It is as strict as libzmq's zmq_z85_decode (a
// character outside the alphabet, or a group of five worth 2^32 or more, is refused), so a key it takes
// is one ZMQ_CURVE_SECRETKEY takes too.
func decodeCurveKey(s string) (k [curveKeyLen]byte, err error) {
	if len(s) != z85KeyLen {
		return k, fmt.Errorf("want %d characters of Z85 (a %d-byte key), got %d characters", z85KeyLen, curveKeyLen, len(s))
	}
	for g := 0; g < z85KeyLen/5; g++ {
		var v uint64
		for _, c := range []byte(s[5*g : 5*g+5]) {
			d := z85Digits[c]
			if d == 0 {
				return k, errors.New("not Z85: a character outside the Z85 alphabet")
			}
			v = 85*v + uint64(d-1)
		}
		if v > 0xffff_ffff {
			return k, errors.New("not Z85: a group of five characters is worth more than four bytes")
		}
		k[4*g], k[4*g+1], k[4*g+2], k[4*g+3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	}
	return k, nil
}

// encodeCurveKey returns k as 40 characters of Z85.
func encodeCurveKey(k [curveKeyLen]byte) string {
	var b [z85KeyLen]byte
	for g := 0; g < curveKeyLen/4; g++ {
		v := uint32(k[4*g])<<24 | uint32(k[4*g+1])<<16 | uint32(k[4*g+2])<<8 | uint32(k[4*g+3])
		for i := 4; i >= 0; i-- {
			b[5*g+i] = z85Alphabet[v%85]
			v /= 85
		}
	}
	return string(b[:])
}

// CurvePublicKey returns the Z85 public key of the Z85 CURVE secret key secret (X25519, as libzmq's
// zmq_curve_public): what the engines need as their server key (ZMQ_CURVE_SERVERKEY) when
// SubscriberConfig.CurveSecretKey is secret. Logging or printing it is safe; the secret stays secret.
func CurvePublicKey(secret string) (string, error) {
	k, err := decodeCurveKey(secret)
	if err != nil {
		return "", fmt.Errorf("cannot decode curve secret key: %w", err)
	}
	priv, err := ecdh.X25519().NewPrivateKey(k[:])
	if err != nil {
		return "", fmt.Errorf("cannot derive curve public key: %w", err)
	}
	var pub [curveKeyLen]byte
	copy(pub[:], priv.PublicKey().Bytes())
	return encodeCurveKey(pub), nil
}

// parsePublisher parses one AllowedPublishers entry: an IP address (v4 or v6) or a CIDR prefix. An
// IPv4-mapped IPv6 address is taken as its IPv4 form, as peers' addresses are (authPolicy.allows).
func parsePublisher(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("cannot use allowed_publishers %q: want an IP address or a CIDR prefix such as 10.0.0.0/8 or fd00::/8", s)
		}
		if p.Addr().Is4In6() {
			return netip.Prefix{}, fmt.Errorf("cannot use allowed_publishers %q: write an IPv4 prefix in IPv4 form", s)
		}
		if m := p.Masked(); m != p {
			return netip.Prefix{}, fmt.Errorf("cannot use allowed_publishers %q: host bits are set; want %q", s, m.String())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("cannot use allowed_publishers %q: want an IP address or a CIDR prefix such as 10.0.0.0/8 or fd00::/8", s)
	}
	if a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("cannot use allowed_publishers %q: an IPv6 zone is not part of a peer's address; drop it", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// hasPolicy reports whether c asks for a publisher policy (an allow-list or CURVE).
func (c *SubscriberConfig) hasPolicy() bool {
	return len(c.AllowedPublishers) > 0 || c.CurveSecretKey != "" || len(c.CurveClientKeys) > 0
}

// validatePolicy appends the problems of c's publisher policy to errs.
func (c *SubscriberConfig) validatePolicy(errs []error) []error {
	if !c.hasPolicy() {
		return errs
	}
	switch c.Mode {
	case "bind":
	case "", "connect":
		// In connect mode the gateway chooses whom it talks to: the endpoint itself is the check (the
		// gateway's egress policy), and a SUB that connects has no publishers to admit.
		for _, e := range []struct {
			key string
			set bool
		}{
			{"allowed_publishers", len(c.AllowedPublishers) > 0},
			{"curve_secret_key", c.CurveSecretKey != ""},
			{"curve_client_keys", len(c.CurveClientKeys) > 0},
		} {
			if e.set {
				errs = append(errs, fmt.Errorf("cannot use %s in connect mode: only a bound socket admits publishers "+
					"(a connect-mode endpoint is checked by the gateway's egress policy)", e.key))
			}
		}
		return errs
	default:
		return errs // Validate reported the mode
	}
	scheme, _, _ := strings.Cut(c.Endpoint, "://")
	if len(c.AllowedPublishers) > 0 {
		if scheme != "tcp" && CheckEndpoint(c.Endpoint) == nil {
			errs = append(errs, fmt.Errorf("cannot use allowed_publishers with endpoint %q: only tcp:// peers have an IP address to check", c.Endpoint))
		}
		for _, s := range c.AllowedPublishers {
			if _, err := parsePublisher(s); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.CurveSecretKey != "" {
		if scheme == "inproc" {
			errs = append(errs, fmt.Errorf("cannot use curve_secret_key with endpoint %q: inproc connections skip the security handshake", c.Endpoint))
		}
		// Neither the key nor anything about it (its length, which character is wrong) goes into an error:
		// config errors are logged, printed and answered to the org whose provider names the variable.
		if _, err := decodeCurveKey(c.CurveSecretKey); err != nil {
			errs = append(errs, fmt.Errorf("cannot use curve_secret_key: want %d characters of Z85 (a %d-byte key)", z85KeyLen, curveKeyLen))
		} else if !curveAvailable() {
			errs = append(errs, errors.New("cannot use curve_secret_key: this libzmq has no CURVE support (it was built without libsodium)"))
		}
		if len(c.CurveClientKeys) == 0 {
			// libzmq would then admit any client that knows the server's public key, which is public.
			errs = append(errs, errors.New("cannot use curve_secret_key without curve_client_keys: every client key would be admitted"))
		}
	} else if len(c.CurveClientKeys) > 0 {
		errs = append(errs, errors.New("cannot use curve_client_keys without curve_secret_key: the gateway needs its own key pair for CURVE"))
	}
	for _, s := range c.CurveClientKeys {
		if _, err := decodeCurveKey(s); err != nil {
			errs = append(errs, fmt.Errorf("cannot use curve_client_keys %q: %w", s, err))
		}
	}
	return errs
}

// authPolicy is the compiled publisher policy of one bind-mode socket (every target sharing it has the same
// policy: SameSocket), looked up by its ZAP domain.
type authPolicy struct {
	endpoint string
	domain   string
	// prefixes admits a peer whose address one of them contains; empty admits any address.
	prefixes []netip.Prefix
	// curve requires the CURVE mechanism and a client key from clientKeys; else NULL is required.
	curve      bool
	clientKeys map[[curveKeyLen]byte]struct{}
	// logged limits the refusal log lines; guarded by authorizer.mu.
	logged logLimiter
}

// newAuthPolicy compiles c's policy under domain, or returns nil when c has none. c must be valid
// (Validate).
func newAuthPolicy(domain string, c *SubscriberConfig) (*authPolicy, error) {
	if !c.hasPolicy() {
		return nil, nil
	}
	p := &authPolicy{endpoint: c.Endpoint, domain: domain, curve: c.CurveSecretKey != ""}
	for _, s := range c.AllowedPublishers {
		pr, err := parsePublisher(s)
		if err != nil {
			return nil, err
		}
		p.prefixes = append(p.prefixes, pr)
	}
	if p.curve {
		p.clientKeys = make(map[[curveKeyLen]byte]struct{}, len(c.CurveClientKeys))
		for _, s := range c.CurveClientKeys {
			k, err := decodeCurveKey(s)
			if err != nil {
				return nil, fmt.Errorf("cannot use curve_client_keys %q: %w", s, err)
			}
			p.clientKeys[k] = struct{}{}
		}
	}
	return p, nil
}

// allows decides one connection: "" admits it, anything else is why not (for the log and the ZAP
// status text). address is the peer's IP as libzmq gives it: "::ffff:a.b.c.d" for an IPv4 peer of an
// IPv6 socket, which counts as a.b.c.d.
func (p *authPolicy) allows(address string, mechanism []byte, credentials [][]byte) string {
	want := "NULL"
	if p.curve {
		want = "CURVE"
	}
	if string(mechanism) != want {
		return fmt.Sprintf("mechanism %q is not allowed (want %s)", mechanism, want)
	}
	if len(p.prefixes) > 0 {
		a, err := netip.ParseAddr(address)
		if err != nil {
			return fmt.Sprintf("address %q is not an IP address", address)
		}
		a = a.WithZone("").Unmap()
		found := false
		for _, pr := range p.prefixes {
			if pr.Contains(a) {
				found = true
				break
			}
		}
		if !found {
			return "address is not in allowed_publishers"
		}
	}
	if p.curve {
		if len(credentials) != 1 || len(credentials[0]) != curveKeyLen {
			return "no CURVE client key"
		}
		var k [curveKeyLen]byte
		copy(k[:], credentials[0])
		if _, ok := p.clientKeys[k]; !ok {
			return "client key " + encodeCurveKey(k) + " is not in curve_client_keys"
		}
	}
	return ""
}

// ZAP status codes (RFC 27): 300 (temporary failure) is never used, a refusal is final.
const (
	zapOK       = "200"
	zapRefused  = "400"
	zapInternal = "500"
)

// zapVersion is the only version of RFC 27.
const zapVersion = "1.0"

// zapRequest is a parsed ZAP request; its slices alias the received frames.
type zapRequest struct {
	id, domain, address, identity, mechanism []byte
	credentials                              [][]byte
}

// zapCredentials is the number of credential frames each known mechanism sends (RFC 27, "Mechanisms").
var zapCredentials = map[string]int{"NULL": 0, "PLAIN": 2, "CURVE": 1, "GSSAPI": 1}

// parseZAPRequest parses a request as the REP socket delivers it: [version, request_id, domain, address,
// identity, mechanism, credentials...]. It never panics; r.id is set whenever there is a second frame, so
// that even a malformed request gets a reply its sender can match.
func parseZAPRequest(frames [][]byte) (r zapRequest, err error) {
	if len(frames) > 1 {
		r.id = frames[1]
	}
	if len(frames) < 6 {
		return r, fmt.Errorf("%d frames, want at least 6", len(frames))
	}
	if string(frames[0]) != zapVersion {
		return r, fmt.Errorf("version %q, want %q", frames[0], zapVersion)
	}
	r.domain, r.address, r.identity, r.mechanism, r.credentials = frames[2], frames[3], frames[4], frames[5], frames[6:]
	if n, ok := zapCredentials[string(r.mechanism)]; ok && len(r.credentials) != n {
		return r, fmt.Errorf("mechanism %s with %d credential frames, want %d", r.mechanism, len(r.credentials), n)
	}
	return r, nil
}

// authorizer answers ZAP requests for the bind-mode sockets that have a policy, one per ZAP domain. It is
// safe for concurrent use (policies come and go with Subscriber.Add and Remove while the handler answers).
type authorizer struct {
	log *slog.Logger

	mu       sync.Mutex
	policies map[string]*authPolicy // by domain
	serial   uint64                 // numbers the domains

	// malformedLog limits the log lines about malformed requests; guarded by mu.
	malformedLog logLimiter

	// errors counts requests that were malformed or named no known domain (Subscriber.AuthErrors).
	errors atomic.Uint64
}

func newAuthorizer(log *slog.Logger) *authorizer {
	return &authorizer{log: log, policies: make(map[string]*authPolicy)}
}

// domain returns a ZAP domain no other socket used: a socket closed and opened again for the same
// endpoint gets a new one, so a late request for the old socket finds nothing rather than the new policy.
func (a *authorizer) domain() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.serial++
	return fmt.Sprintf("rolter-kv-%d", a.serial)
}

func (a *authorizer) add(p *authPolicy) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.policies[p.domain] = p
}

func (a *authorizer) remove(domain string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.policies, domain)
}

// answer returns the reply to one request: [version, request_id, status_code, status_text, user_id,
// metadata]. It never panics: a malformed request is answered 500, one for an unknown domain 400, both
// counted in a.errors; a refusal is logged (at most once per refusalLogEvery per socket), and counted by
// the socket's monitor (StreamStats.AuthRefused), which also sees the handshakes refused before
// they reach ZAP.
func (a *authorizer) answer(frames [][]byte, now time.Time) (reply [6][]byte) {
	id := []byte(nil)
	if len(frames) > 1 {
		id = frames[1]
	}
	status := func(code, text string) [6][]byte {
		return [6][]byte{[]byte(zapVersion), id, []byte(code), []byte(text), nil, nil}
	}
	defer func() {
		if r := recover(); r != nil {
			a.errors.Add(1)
			a.log.Error("BUG: ZAP request panicked; refused", "panic", r)
			reply = status(zapInternal, "internal error")
		}
	}()
	a.mu.Lock()
	defer a.mu.Unlock()
	r, err := parseZAPRequest(frames)
	if err != nil {
		a.errors.Add(1)
		if ok, suppressed := a.malformedLog.allow(now); ok {
			a.log.Warn("malformed ZAP request; refused", "err", err, "refused_before_unlogged", suppressed)
		}
		return status(zapInternal, "malformed request")
	}
	p := a.policies[string(r.domain)]
	if p == nil {
		// A socket of a target just removed, or one this package did not configure: refuse.
		a.errors.Add(1)
		return status(zapRefused, "unknown domain")
	}
	why := p.allows(string(r.address), r.mechanism, r.credentials)
	if why == "" {
		return status(zapOK, "OK")
	}
	if ok, suppressed := p.logged.allow(now); ok {
		a.log.Warn("kv events publisher refused", "endpoint", p.endpoint, "address", string(r.address),
			"mechanism", string(r.mechanism), "reason", why, "refused_before_unlogged", suppressed)
	}
	return status(zapRefused, why)
}

// refusalLogEvery spaces the log lines about refused publishers of one socket: a publisher with the wrong
// server key retries every 100 ms (libzmq's default ZMQ_RECONNECT_IVL), and anyone may connect as often as
// they like.
const refusalLogEvery = 30 * time.Second

// logLimiter lets one log line through per refusalLogEvery and counts the others. It is not safe for
// concurrent use: its owner serialises it.
type logLimiter struct {
	last       time.Time
	suppressed uint64
}

// allow reports whether to log now and how many lines were held back since the last one.
func (l *logLimiter) allow(now time.Time) (ok bool, suppressed uint64) {
	if !l.last.IsZero() && now.Sub(l.last) < refusalLogEvery {
		l.suppressed++
		return false, 0
	}
	l.last, suppressed, l.suppressed = now, l.suppressed, 0
	return true, suppressed
}
