package kvindex

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The key pairs of zmq_curve(7), "Test key values" (also libzmq's tests/testutil_security.cpp).
const (
	testClientPublic = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID"
	testClientSecret = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs"
	testServerPublic = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
	testServerSecret = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6"
)

func TestCurveKeyZ85(t *testing.T) {
	f := func(s string, wantErr string) {
		t.Helper()
		k, err := decodeCurveKey(s)
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("%q: got error %v; want one containing %q", s, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: unexpected error %s", s, err)
		}
		if got := encodeCurveKey(k); got != s {
			t.Fatalf("%q: encodes back to %q", s, got)
		}
	}
	f(testClientPublic, "")
	f(testServerSecret, "")
	f(strings.Repeat("0", 40), "")
	f(strings.Repeat("%nSc0", 8), "") // 0xffffffff per group, the largest value
	f(strings.Repeat("%nSc1", 8), "worth more than four bytes")
	f(strings.Repeat("#", 40), "worth more than four bytes")
	f(testClientPublic[:39]+"~", "outside the Z85 alphabet")
	f(testClientPublic[:39]+" ", "outside the Z85 alphabet")
	f(testClientPublic[:39], "want 40 characters")
	f(testClientPublic+"0", "want 40 characters")
	f("", "got 0 characters")

	// ZMQ RFC 32's example, in the first group of a key.
	k, err := decodeCurveKey("HelloWorld" + strings.Repeat("0", 30))
	if err != nil || !bytes.Equal(k[:8], []byte{0x86, 0x4f, 0xd2, 0x6f, 0xb5, 0x59, 0xf7, 0x5b}) {
		t.Fatalf("RFC 32 example decodes to %x, %v", k[:8], err)
	}
}

func TestCurvePublicKey(t *testing.T) {
	f := func(secret, want string) {
		t.Helper()
		got, err := CurvePublicKey(secret)
		if err != nil || got != want {
			t.Fatalf("CurvePublicKey(%q) = %q, %v; want %q", secret, got, err, want)
		}
	}
	f(testClientSecret, testClientPublic)
	f(testServerSecret, testServerPublic)
	if _, err := CurvePublicKey("short"); err == nil || !strings.HasPrefix(err.Error(), "cannot decode curve secret key: ") {
		t.Fatalf("unexpected error %v", err)
	}
}

func TestSubscriberConfigValidatePolicy(t *testing.T) {
	// Every message starts with "cannot use <key>" followed by a space or a colon: the engine maps it to
	// the config key by that word.
	f := func(c SubscriberConfig, want ...string) {
		t.Helper()
		var got []string
		for _, err := range unjoinErrs(c.Validate()) {
			got = append(got, err.Error())
			if strings.Contains(err.Error(), testServerSecret) || strings.Contains(err.Error(), "TESTSECRET") {
				t.Fatalf("%+v: an error shows the secret key: %s", c, err)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%+v: got errors %q; want %d", c, got, len(want))
		}
		for i := range want {
			if !strings.HasPrefix(got[i], want[i]) {
				t.Fatalf("%+v: error %d is %q; want it to start with %q", c, i, got[i], want[i])
			}
		}
	}
	bind := func(ep string, allowed []string, secret string, clients ...string) SubscriberConfig {
		return SubscriberConfig{Endpoint: ep, Mode: "bind", AllowedPublishers: allowed, CurveSecretKey: secret, CurveClientKeys: clients}
	}
	ep := "tcp://*:5557"
	f(bind(ep, nil, ""))
	f(bind(ep, []string{"127.0.0.1", "10.0.0.0/8", "::1", "fd00::/8", "::ffff:10.1.2.3", "0.0.0.0/0"}, ""))
	f(bind("tcp://[::]:5557", []string{"2001:db8::/32"}, testServerSecret, testClientPublic, testServerPublic))
	f(bind("ipc:///run/kv.sock", nil, testServerSecret, testClientPublic))
	f(bind(ep, nil, testServerSecret, testClientPublic))

	f(bind(ep, []string{"10.0.0.1/8"}, ""), `cannot use allowed_publishers "10.0.0.1/8": host bits are set; want "10.0.0.0/8"`)
	f(bind(ep, []string{"fd00::1/8"}, ""), `cannot use allowed_publishers "fd00::1/8": host bits are set; want "fd00::/8"`)
	f(bind(ep, []string{"engine-1", "10.0.0.0/33", "", "10.0.0.0/8 "}, ""),
		`cannot use allowed_publishers "engine-1": want an IP address or a CIDR prefix`,
		`cannot use allowed_publishers "10.0.0.0/33": want`,
		`cannot use allowed_publishers "": want`,
		`cannot use allowed_publishers "10.0.0.0/8 ": want`)
	f(bind(ep, []string{"fe80::1%eth0"}, ""), `cannot use allowed_publishers "fe80::1%eth0": an IPv6 zone`)
	f(bind(ep, []string{"::ffff:10.0.0.0/104"}, ""), `cannot use allowed_publishers "::ffff:10.0.0.0/104": write an IPv4 prefix in IPv4 form`)
	f(bind("ipc:///run/kv.sock", []string{"127.0.0.1"}, ""), `cannot use allowed_publishers with endpoint "ipc:///run/kv.sock": only tcp://`)
	f(bind("inproc://kv", nil, testServerSecret, testClientPublic), `cannot use curve_secret_key with endpoint "inproc://kv": inproc connections skip`)

	f(bind(ep, nil, "TESTSECRET"), "cannot use curve_secret_key: want 40 characters of Z85",
		"cannot use curve_secret_key without curve_client_keys")
	f(bind(ep, nil, testServerSecret), "cannot use curve_secret_key without curve_client_keys: every client key would be admitted")
	f(bind(ep, nil, "", testClientPublic), "cannot use curve_client_keys without curve_secret_key")
	f(bind(ep, nil, testServerSecret, testClientPublic, "nope"), `cannot use curve_client_keys "nope": want 40 characters of Z85`)

	// Connect mode: the gateway picks the endpoint; the egress policy checks it.
	for _, mode := range []string{"", "connect"} {
		c := SubscriberConfig{Endpoint: "tcp://10.0.0.1:5557", Mode: mode}
		c.AllowedPublishers = []string{"10.0.0.1"}
		f(c, "cannot use allowed_publishers in connect mode: only a bound socket admits publishers")
		c.CurveSecretKey, c.CurveClientKeys = testServerSecret, []string{testClientPublic}
		f(c, "cannot use allowed_publishers in connect mode", "cannot use curve_secret_key in connect mode",
			"cannot use curve_client_keys in connect mode")
	}
	// A bad mode or endpoint is reported once, by its own check.
	f(SubscriberConfig{Endpoint: ep, Mode: "pull", AllowedPublishers: []string{"10.0.0.1"}}, `cannot use mode "pull"`)
	f(bind("udp://x", []string{"10.0.0.1"}, ""), "cannot use endpoint:")
}

func unjoinErrs(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestParseZAPRequest(t *testing.T) {
	f := func(frames []string, wantID, wantErr string) {
		t.Helper()
		var in [][]byte
		for _, s := range frames {
			in = append(in, []byte(s))
		}
		r, err := parseZAPRequest(in)
		if string(r.id) != wantID {
			t.Fatalf("%q: request id %q; want %q", frames, r.id, wantID)
		}
		switch {
		case wantErr == "" && err != nil:
			t.Fatalf("%q: unexpected error %s", frames, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Fatalf("%q: got error %v; want one containing %q", frames, err, wantErr)
		}
	}
	f([]string{"1.0", "7", "d", "127.0.0.1", "", "NULL"}, "7", "")
	f([]string{"1.0", "7", "d", "127.0.0.1", "id", "CURVE", strings.Repeat("k", 32)}, "7", "")
	f([]string{"1.0", "7", "d", "127.0.0.1", "", "PLAIN", "user", "password"}, "7", "")
	f([]string{"1.0", "7", "d", "127.0.0.1", "", "SOMETHING", "x", "y", "z"}, "7", "") // the policy refuses it
	f(nil, "", "0 frames")
	f([]string{""}, "", "1 frames")
	f([]string{"1.0", "8"}, "8", "2 frames")
	f([]string{"1.0", "8", "d", "a", ""}, "8", "5 frames")
	f([]string{"2.0", "9", "d", "a", "", "NULL"}, "9", `version "2.0"`)
	f([]string{"1.0", "9", "d", "a", "", "NULL", "extra"}, "9", "NULL with 1 credential frames, want 0")
	f([]string{"1.0", "9", "d", "a", "", "CURVE"}, "9", "CURVE with 0 credential frames, want 1")
	f([]string{"1.0", "9", "d", "a", "", "PLAIN", "user"}, "9", "PLAIN with 1 credential frames, want 2")
}

func TestAuthorizerAnswer(t *testing.T) {
	var logs bytes.Buffer
	a := newAuthorizer(slog.New(slog.NewTextHandler(&logs, nil)))
	add := func(c SubscriberConfig) string {
		t.Helper()
		c.Mode = "bind"
		if err := c.Validate(); err != nil {
			t.Fatalf("invalid config: %s", err)
		}
		d := a.domain()
		p, err := newAuthPolicy(d, &c)
		if err != nil || p == nil {
			t.Fatalf("cannot compile policy: %v", err)
		}
		a.add(p)
		return d
	}
	v4 := add(SubscriberConfig{Endpoint: "tcp://*:1", AllowedPublishers: []string{"10.0.0.0/24", "192.168.1.7"}})
	v6 := add(SubscriberConfig{Endpoint: "tcp://[::]:1", AllowedPublishers: []string{"fd00::/8", "10.9.9.9"}})
	client, err := decodeCurveKey(testClientPublic)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := decodeCurveKey(testServerPublic)
	curve := add(SubscriberConfig{Endpoint: "tcp://*:1", CurveSecretKey: testServerSecret, CurveClientKeys: []string{testClientPublic}})
	both := add(SubscriberConfig{Endpoint: "tcp://*:1", AllowedPublishers: []string{"10.0.0.1"}, CurveSecretKey: testServerSecret,
		CurveClientKeys: []string{testClientPublic}})
	removed := add(SubscriberConfig{Endpoint: "tcp://*:1", AllowedPublishers: []string{"10.0.0.1"}})
	a.remove(removed)

	wantErrors := uint64(0)
	f := func(frames [][]byte, wantStatus, wantText string) {
		t.Helper()
		reply := a.answer(frames, time.Now())
		wantID := []byte(nil)
		if len(frames) > 1 {
			wantID = frames[1]
		}
		if string(reply[0]) != "1.0" || !bytes.Equal(reply[1], wantID) || string(reply[2]) != wantStatus ||
			!strings.Contains(string(reply[3]), wantText) || len(reply[4]) != 0 || len(reply[5]) != 0 {
			t.Fatalf("%q: reply %q; want status %s, text with %q", frames, reply, wantStatus, wantText)
		}
		if wantStatus == zapInternal || wantText == "unknown domain" {
			wantErrors++
		}
		if got := a.errors.Load(); got != wantErrors {
			t.Fatalf("%q: %d errors counted; want %d", frames, got, wantErrors)
		}
	}
	req := func(domain, address, mechanism string, creds ...[]byte) [][]byte {
		return append([][]byte{[]byte("1.0"), []byte("42"), []byte(domain), []byte(address), nil, []byte(mechanism)}, creds...)
	}
	// Addresses, IPv4 and IPv6; an IPv4 peer of a dual-stack socket is its IPv4 address.
	f(req(v4, "10.0.0.5", "NULL"), zapOK, "OK")
	f(req(v4, "10.0.0.255", "NULL"), zapOK, "OK")
	f(req(v4, "::ffff:10.0.0.5", "NULL"), zapOK, "OK")
	f(req(v4, "192.168.1.7", "NULL"), zapOK, "OK")
	f(req(v4, "10.0.1.5", "NULL"), zapRefused, "address is not in allowed_publishers")
	f(req(v4, "192.168.1.8", "NULL"), zapRefused, "not in allowed_publishers")
	f(req(v4, "::1", "NULL"), zapRefused, "not in allowed_publishers")
	f(req(v4, "", "NULL"), zapRefused, `address "" is not an IP address`)
	f(req(v4, "garbage", "NULL"), zapRefused, "is not an IP address")
	f(req(v4, "10.0.0.5", "CURVE", client[:]), zapRefused, `mechanism "CURVE" is not allowed (want NULL)`)
	f(req(v4, "10.0.0.5", "PLAIN", []byte("u"), []byte("p")), zapRefused, "mechanism \"PLAIN\" is not allowed")
	f(req(v6, "fd12::3", "NULL"), zapOK, "OK")
	f(req(v6, "fd12::3%eth0", "NULL"), zapOK, "OK")
	f(req(v6, "10.9.9.9", "NULL"), zapOK, "OK")
	f(req(v6, "::ffff:10.9.9.9", "NULL"), zapOK, "OK")
	f(req(v6, "fe80::1", "NULL"), zapRefused, "not in allowed_publishers")
	f(req(v6, "127.0.0.1", "NULL"), zapRefused, "not in allowed_publishers")
	// CURVE: the mechanism and the client key.
	f(req(curve, "203.0.113.9", "CURVE", client[:]), zapOK, "OK")
	f(req(curve, "203.0.113.9", "CURVE", other[:]), zapRefused, "client key "+testServerPublic+" is not in curve_client_keys")
	f(req(curve, "203.0.113.9", "NULL"), zapRefused, `mechanism "NULL" is not allowed (want CURVE)`)
	f(req(curve, "203.0.113.9", "GSSAPI", []byte("x")), zapRefused, "not allowed")
	f(req(curve, "203.0.113.9", "CURVE", client[:31]), zapRefused, "no CURVE client key")
	f(req(both, "10.0.0.1", "CURVE", client[:]), zapOK, "OK")
	f(req(both, "10.0.0.2", "CURVE", client[:]), zapRefused, "not in allowed_publishers")
	f(req(both, "10.0.0.1", "CURVE", other[:]), zapRefused, "not in curve_client_keys")
	// Unknown domains: a removed target, or a socket this package did not configure.
	f(req(removed, "10.0.0.1", "NULL"), zapRefused, "unknown domain")
	f(req("", "10.0.0.1", "CURVE", client[:]), zapRefused, "unknown domain")
	// Malformed requests: 500, never a panic.
	f(nil, zapInternal, "malformed")
	f([][]byte{nil}, zapInternal, "malformed")
	f([][]byte{[]byte("1.0"), []byte("id")}, zapInternal, "malformed")
	f([][]byte{[]byte("0.9"), []byte("id"), []byte(v4), []byte("10.0.0.5"), nil, []byte("NULL")}, zapInternal, "malformed")
	f(req(curve, "203.0.113.9", "CURVE"), zapInternal, "malformed")
	f(req(curve, "203.0.113.9", "CURVE", client[:], client[:]), zapInternal, "malformed")

	// Refusals are logged once per refusalLogEvery and target (four targets refused), with the address;
	// malformed requests once per refusalLogEvery.
	if n := strings.Count(logs.String(), "kv events publisher refused"); n != 4 {
		t.Fatalf("%d refusal log lines; want 4 (one per target and interval):\n%s", n, logs.String())
	}
	if n := strings.Count(logs.String(), "malformed ZAP request"); n != 1 {
		t.Fatalf("%d malformed-request log lines; want 1:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "address=10.0.1.5") {
		t.Fatalf("the refusal log line does not name the address:\n%s", logs.String())
	}
}

func TestLogLimiter(t *testing.T) {
	var l logLimiter
	t0 := time.Unix(1000, 0)
	f := func(at time.Duration, wantOK bool, wantSuppressed uint64) {
		t.Helper()
		ok, suppressed := l.allow(t0.Add(at))
		if ok != wantOK || suppressed != wantSuppressed {
			t.Fatalf("at %s: got %v, %d; want %v, %d", at, ok, suppressed, wantOK, wantSuppressed)
		}
	}
	f(0, true, 0)
	f(time.Second, false, 0)
	f(29*time.Second, false, 0)
	f(30*time.Second, true, 2)
	f(31*time.Second, false, 0)
	f(2*time.Minute, true, 1)
}

func TestIPv6Host(t *testing.T) {
	f := func(ep string, want bool) {
		t.Helper()
		if got := ipv6Host(ep); got != want {
			t.Fatalf("ipv6Host(%q) = %v; want %v", ep, got, want)
		}
	}
	f("tcp://[::]:5557", true)
	f("tcp://[::1]:5557", true)
	f("tcp://[fe80::1%eth0]:5557", true)
	f("tcp://*:5557", false)
	f("tcp://127.0.0.1:5557", false)
	f("tcp://engine:5557", false)
	f("ipc:///tmp/x:y", false)
	f("tcp://::1", false)
}
