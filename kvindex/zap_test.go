//go:build cgo

package kvindex

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// noSubscription reports whether no subscription reached p within wait: a subscriber whose connection
// was refused never sends one (the subscription follows the handshake).
func (p *testPub) noSubscription(wait time.Duration) bool {
	p.t.Helper()
	_ = p.sock.SetRcvtimeo(wait)
	defer func() { _ = p.sock.SetRcvtimeo(10 * time.Second) }()
	for {
		msg, err := p.sock.RecvBytes(0)
		if err != nil {
			return zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
		}
		if len(msg) > 0 && msg[0] == 1 {
			return false
		}
	}
}

// checkAdmitted checks that the batches pub sends (sequences 0 and 1) reached target t, whose stream is
// st, and that nothing was refused.
func checkAdmitted(t *testing.T, name string, ix *Index, target int, st *Stream, pub *testPub) {
	t.Helper()
	pub.waitSubscribed()
	pub.publish("", 0, 1)
	waitFor(t, name+": seq 1", func() bool { return st.Stats().LastSeq == 1 })
	stats := st.Stats()
	if !stats.Trusted || stats.Batches != 2 || stats.AuthRefused != 0 || stats.Disconnects != 0 ||
		!residentOn(ix, target, 0) || !residentOn(ix, target, 1) {
		t.Fatalf("%s: the admitted publisher's batches were not applied: %+v", name, stats)
	}
}

// checkRefused checks that target t refused pub: the refusal is counted, no subscription reached pub,
// and what pub sends (sequences 0 and 1) is not ingested. A refused libzmq publisher does not retry
// (except after a wrong server key), so one refusal is all there is to wait for.
func checkRefused(t *testing.T, name string, ix *Index, target int, st *Stream, pub *testPub) {
	t.Helper()
	waitFor(t, name+": a refusal", func() bool { return st.Stats().AuthRefused >= 1 })
	if !pub.noSubscription(300 * time.Millisecond) {
		t.Fatalf("%s: a refused publisher received the target's subscription", name)
	}
	pub.publish("", 0, 1)
	stats := st.Stats()
	if stats.Batches != 0 || stats.HasSeq || stats.GarbageFrames != 0 || stats.Disconnects != 0 ||
		residentOn(ix, target, 0) || residentOn(ix, target, 1) {
		t.Fatalf("%s: a refused publisher reached the index: %+v", name, stats)
	}
}

func hasIPv6Loopback() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

func TestSubscriberAllowedPublishers(t *testing.T) {
	// One publisher connects to two bind-mode targets of one subscriber: the target whose allow-list
	// admits its address ingests its batches, the other refuses it (counted, nothing ingested). Each
	// target asks the ZAP handler under its own domain, so each keeps its own list.
	f := func(name, bindHost, pubHost string, admitting, refusing []string) {
		t.Helper()
		if strings.Contains(bindHost+pubHost, ":") && !hasIPv6Loopback() {
			t.Logf("%s: skipped: no IPv6 loopback", name)
			return
		}
		zctx := newTestContext(t)
		ix := NewIndex(2)
		s := newTestSubscriber(t, ix)
		var streams [2]*Stream
		var connect [2]string
		for i, allowed := range [][]string{admitting, refusing} {
			port := freePort(t)
			st, err := s.Add(i, SubscriberConfig{Endpoint: "tcp://" + bindHost + ":" + port, Mode: "bind", AllowedPublishers: allowed})
			if err != nil {
				t.Fatalf("%s: cannot add: %s", name, err)
			}
			streams[i], connect[i] = st, "tcp://"+pubHost+":"+port
		}
		s.Start(context.Background())
		// The refused target first: once connected to the other one, the publisher has its subscription.
		pub := newTestPubWith(t, zctx, connect[1], func(sock *zmq.Socket) error { return sock.SetIpv6(true) })
		checkRefused(t, name, ix, 1, streams[1], pub)
		if err := pub.sock.Connect(connect[0]); err != nil {
			t.Fatalf("%s: cannot connect: %s", name, err)
		}
		checkAdmitted(t, name, ix, 0, streams[0], pub)
		if stats := streams[1].Stats(); stats.Batches != 0 || residentOn(ix, 1, 0) {
			t.Fatalf("%s: the refusing target ingested the batches: %+v", name, stats)
		}
		if s.AuthErrors() != 0 {
			t.Fatalf("%s: %d ZAP errors", name, s.AuthErrors())
		}
	}
	f("ipv4", "127.0.0.1", "127.0.0.1", []string{"127.0.0.1"}, []string{"10.9.9.9/32"})
	f("ipv4 prefixes", "127.0.0.1", "127.0.0.1", []string{"10.0.0.0/8", "127.0.0.0/8"}, []string{"10.9.9.9/32", "::1", "128.0.0.0/1"})
	f("ipv6", "[::1]", "[::1]", []string{"::1"}, []string{"fd00::/8"})
	f("ipv6 prefix", "[::1]", "[::1]", []string{"fd00::/8", "::/64"}, []string{"127.0.0.1"})
	// A dual-stack bind sees an IPv4 peer as ::ffff:127.0.0.1, which counts as 127.0.0.1.
	f("dual stack", "[::]", "127.0.0.1", []string{"127.0.0.1/32"}, []string{"::1", "fd00::/8"})
}

func TestSubscriberCurve(t *testing.T) {
	if !zmq.HasCurve() {
		t.Skip("libzmq has no CURVE")
	}
	serverPublic, serverSecret, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Fatalf("cannot make a key pair: %s", err)
	}
	if got, err := CurvePublicKey(serverSecret); err != nil || got != serverPublic {
		t.Fatalf("CurvePublicKey = %q, %v; libzmq says %q", got, err, serverPublic)
	}
	allowedPublic, allowedSecret, _ := zmq.NewCurveKeypair()
	otherPublic, otherSecret, _ := zmq.NewCurveKeypair()
	client := func(serverKey, public, secret string) func(*zmq.Socket) error {
		return func(sock *zmq.Socket) error {
			for _, err := range []error{sock.SetCurveServerkey(serverKey), sock.SetCurvePublickey(public), sock.SetCurveSecretkey(secret)} {
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	f := func(name, endpoint string, allowed []string, setup func(*zmq.Socket) error, wantAdmitted bool) {
		t.Helper()
		zctx := newTestContext(t)
		ix := NewIndex(1)
		s := newTestSubscriber(t, ix)
		st, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind", AllowedPublishers: allowed,
			CurveSecretKey: serverSecret, CurveClientKeys: []string{allowedPublic}})
		if err != nil {
			t.Fatalf("%s: cannot add: %s", name, err)
		}
		s.Start(context.Background())
		pub := newTestPubWith(t, zctx, endpoint, setup)
		if wantAdmitted {
			checkAdmitted(t, name, ix, 0, st, pub)
		} else {
			checkRefused(t, name, ix, 0, st, pub)
		}
		if s.AuthErrors() != 0 {
			t.Fatalf("%s: %d ZAP errors", name, s.AuthErrors())
		}
	}
	tcp := func() string { return "tcp://127.0.0.1:" + freePort(t) }
	f("allowed key", tcp(), nil, client(serverPublic, allowedPublic, allowedSecret), true)
	f("another key", tcp(), nil, client(serverPublic, otherPublic, otherSecret), false)
	f("NULL", tcp(), nil, nil, false)
	f("wrong server key", tcp(), nil, client(otherPublic, allowedPublic, allowedSecret), false)
	f("allowed key and address", tcp(), []string{"127.0.0.1"}, client(serverPublic, allowedPublic, allowedSecret), true)
	f("allowed key, other address", tcp(), []string{"10.9.9.9/32"}, client(serverPublic, allowedPublic, allowedSecret), false)
	ipc := "ipc://" + filepath.Join(t.TempDir(), "kv.sock")
	f("ipc, allowed key", ipc, nil, client(serverPublic, allowedPublic, allowedSecret), true)
	f("ipc, NULL", ipc+"2", nil, nil, false)
}

func TestZAPHandlerMalformed(t *testing.T) {
	// Whatever reaches the handler's inproc endpoint gets a reply and never stops it: a test socket in the
	// subscriber's own context (the only way in) sends garbage, then a real publisher is still admitted
	// and judged by its policy.
	ix := NewIndex(1)
	s := newTestSubscriber(t, ix)
	endpoint := "tcp://127.0.0.1:" + freePort(t)
	st, err := s.Add(0, SubscriberConfig{Endpoint: endpoint, Mode: "bind", AllowedPublishers: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	req, err := s.zctx.NewSocket(zmq.REQ)
	if err != nil {
		t.Fatalf("cannot create REQ: %s", err)
	}
	defer req.Close()
	_ = req.SetLinger(0)
	_ = req.SetRcvtimeo(10 * time.Second)
	if err := req.Connect(zapEndpoint); err != nil {
		t.Fatalf("cannot connect to the ZAP handler: %s", err)
	}
	domain := s.workers[0].rd.policy.domain
	wantErrors := uint64(0)
	f := func(frames []string, wantStatus string) {
		t.Helper()
		msg := make([]any, len(frames))
		for i, fr := range frames {
			msg[i] = fr
		}
		if _, err := req.SendMessage(msg...); err != nil {
			t.Fatalf("%q: cannot send: %s", frames, err)
		}
		reply, err := req.RecvMessage(0)
		if err != nil {
			t.Fatalf("%q: no reply: %s", frames, err)
		}
		wantID := ""
		if len(frames) > 1 {
			wantID = frames[1]
		}
		if len(reply) != 6 || reply[0] != "1.0" || reply[1] != wantID || reply[2] != wantStatus {
			t.Fatalf("%q: reply %q; want status %s", frames, reply, wantStatus)
		}
		if wantStatus != zapOK && !(wantStatus == zapRefused && frames[2] == domain) {
			wantErrors++
		}
		if got := s.AuthErrors(); got != wantErrors {
			t.Fatalf("%q: AuthErrors %d; want %d", frames, got, wantErrors)
		}
	}
	f([]string{""}, zapInternal)
	f([]string{"garbage"}, zapInternal)
	f([]string{"1.0", "1"}, zapInternal)
	f([]string{"1.0", "2", domain, "127.0.0.1", ""}, zapInternal)
	f([]string{"9.9", "3", domain, "127.0.0.1", "", "NULL"}, zapInternal)
	f([]string{"1.0", "4", domain, "127.0.0.1", "", "NULL", "unexpected credential"}, zapInternal)
	f([]string{"1.0", "5", domain, "127.0.0.1", "", "CURVE"}, zapInternal)
	f([]string{"1.0", "6", "no such domain", "127.0.0.1", "", "NULL"}, zapRefused)
	f([]string{"1.0", "7", "", "127.0.0.1", "", "NULL"}, zapRefused)
	f([]string{"1.0", "8", domain, "not an address", "", "NULL"}, zapRefused)
	f([]string{"1.0", "9", domain, "10.0.0.1", "", "NULL"}, zapRefused)
	f([]string{"1.0", "10", domain, "127.0.0.1", "", "CURVE", strings.Repeat("k", 32)}, zapRefused)
	f([]string{"1.0", "11", domain, "127.0.0.1", "", "NULL"}, zapOK)
	f([]string{"1.0", strings.Repeat("x", 1<<20), domain, "127.0.0.1", "", "NULL"}, zapOK)

	pub := newTestPub(t, newTestContext(t), endpoint)
	checkAdmitted(t, "after garbage", ix, 0, st, pub)
}

func TestSubscriberAuthLifecycle(t *testing.T) {
	// The ZAP handler starts with the first bind-mode target that has a policy, and only then; a target
	// removed and added again gets a new domain (a late request for the old socket finds nothing); Stop
	// ends every goroutine, the handler last.
	before := runtime.NumGoroutine()
	zctx := newTestContext(t)
	ix := NewIndex(3)
	s, err := NewSubscriber(ix, discardLogger)
	if err != nil {
		t.Fatalf("cannot create subscriber: %s", err)
	}
	if _, err := s.Add(0, SubscriberConfig{Endpoint: "tcp://127.0.0.1:" + freePort(t), Mode: "bind"}); err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if _, err := s.Add(1, SubscriberConfig{Endpoint: "tcp://127.0.0.1:" + freePort(t)}); err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	s.Start(context.Background())
	if s.zap.started {
		t.Fatalf("the ZAP handler started without a target that needs it")
	}

	endpoint := "tcp://127.0.0.1:" + freePort(t)
	cfg := SubscriberConfig{Endpoint: endpoint, Mode: "bind", AllowedPublishers: []string{"127.0.0.1"}}
	st, err := s.Add(2, cfg)
	if err != nil {
		t.Fatalf("cannot add: %s", err)
	}
	if !s.zap.started || s.zap.err != nil {
		t.Fatalf("the ZAP handler did not start with the first target that needs it: %v", s.zap.err)
	}
	oldDomain := s.workers[2].rd.policy.domain
	pub := newTestPub(t, zctx, endpoint)
	checkAdmitted(t, "first", ix, 2, st, pub)

	s.Remove(2)
	s.auth.mu.Lock()
	_, ok := s.auth.policies[oldDomain]
	s.auth.mu.Unlock()
	if ok {
		t.Fatalf("a removed target's policy is still in force")
	}
	cfg.AllowedPublishers = []string{"10.9.9.9"}
	st, err = s.Add(2, cfg)
	if err != nil {
		t.Fatalf("cannot add again: %s", err)
	}
	if d := s.workers[2].rd.policy.domain; d == oldDomain {
		t.Fatalf("a target added again kept its domain %q", d)
	}
	pub2 := newTestPub(t, zctx, endpoint)
	checkRefused(t, "added again", ix, 2, st, pub2)

	s.Stop()
	_ = pub.sock.Close()
	_ = pub2.sock.Close()
	waitFor(t, "goroutines to exit", func() bool { return runtime.NumGoroutine() <= before })
}

func TestSubscriberAuthAddErrors(t *testing.T) {
	// Add validates the policy like the config check does.
	s := newTestSubscriber(t, NewIndex(1))
	f := func(cfg SubscriberConfig, want string) {
		t.Helper()
		_, err := s.Add(0, cfg)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("%+v: got %v; want an error containing %q", cfg, err, want)
		}
	}
	f(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", AllowedPublishers: []string{"127.0.0.1"}}, "cannot use allowed_publishers in connect mode")
	f(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", Mode: "bind", AllowedPublishers: []string{"localhost"}}, `cannot use allowed_publishers "localhost"`)
	f(SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", Mode: "bind", CurveSecretKey: testServerSecret}, "without curve_client_keys")
	s.auth.mu.Lock()
	defer s.auth.mu.Unlock()
	if len(s.auth.policies) != 0 {
		t.Fatalf("a refused Add left a policy behind")
	}
}
