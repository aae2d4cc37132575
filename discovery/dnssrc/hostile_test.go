package dnssrc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/config"
	"golang.org/x/net/dns/dnsmessage"
)

// hostileWatcher is a Watcher of "web.test" A/AAAA records at the fake server, with a short timeout.
func hostileWatcher(t *testing.T, s *fakeServer) *Watcher {
	t.Helper()
	sc := source(config.RecordA, "web.test", s.addr(), 0.2)
	sc.DNS.TimeoutSecs = 0.3
	return newWatcher(t, sc, Options{})
}

// aRecord is an answer section of one A record of web.test.
func aRecord(b *dnsmessage.Builder) error {
	return b.AResource(rr("web.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{127, 0, 0, 11}})
}

// TestHostileServer holds every broken or hostile answer to an error, never a panic or a hang.
func TestHostileServer(t *testing.T) {
	f := func(name string, reply func(req []byte, tcp bool) [][]byte, want string) {
		t.Helper()
		s := newFakeServer(t, reply)
		q, _ := newQuestion("web.test", dnsmessage.TypeA)
		a, err := hostileWatcher(t, s).exchange(context.Background(), q)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: exchange = %+v, %v; want an error with %q", name, a, err, want)
		}
	}
	one := func(make func(req []byte) []byte) func([]byte, bool) [][]byte {
		return func(req []byte, _ bool) [][]byte { return [][]byte{make(req)} }
	}
	f("garbage", one(func([]byte) []byte { return []byte("HTTP/1.1 400 Bad Request\r\n\r\n") }), errTimeout.Error())
	f("wrong ID", one(func(req []byte) []byte {
		m := answerTo(req, nil, aRecord)
		m[0] ^= 0xff
		return m
	}), errTimeout.Error())
	f("a query, not an answer", one(func(req []byte) []byte { return req }), errTimeout.Error())
	f("another question", one(func(req []byte) []byte {
		m := answerTo(req, nil, aRecord)
		m[13] = 'x' // "web" -> "xeb"
		return m
	}), errTimeout.Error())
	f("many strays", func(req []byte, _ bool) [][]byte {
		out := make([][]byte, 2*maxStrays)
		for i := range out {
			out[i] = []byte{byte(i)}
		}
		return out
	}, "datagrams that are not the answer")
	f("SERVFAIL", one(func(req []byte) []byte {
		return answerTo(req, func(h *dnsmessage.Header) { h.RCode = dnsmessage.RCodeServerFailure }, nil)
	}), "SERVFAIL")
	f("REFUSED", one(func(req []byte) []byte {
		return answerTo(req, func(h *dnsmessage.Header) { h.RCode = dnsmessage.RCodeRefused }, nil)
	}), "REFUSED")
	f("compression loop in an answer", one(func(req []byte) []byte { return pointerLoop(req, 1) }), "too many pointers")
	f("long pointer chain in an answer", one(func(req []byte) []byte { return pointerLoop(req, 40) }), "too many pointers")
	f("compression loop in the question", one(func(req []byte) []byte {
		m := answerTo(req, nil, nil)
		return append(m[:12], 0xc0, 12, 0, 1, 0, 1)
	}), errTimeout.Error())
	f("short A record", one(func(req []byte) []byte {
		m := answerTo(req, nil, aRecord)
		m[len(m)-5] = 3 // rdlength 4 -> 3
		return m[:len(m)-1]
	}), "cannot parse the answer")
	f("cut short", one(func(req []byte) []byte {
		m := answerTo(req, nil, aRecord)
		return m[:len(m)-2]
	}), "cannot parse the answer")
	f("truncated, garbage over TCP", func(req []byte, tcp bool) [][]byte {
		if tcp {
			return [][]byte{[]byte("garbage")}
		}
		return [][]byte{answerTo(req, func(h *dnsmessage.Header) { h.Truncated = true }, nil)}
	}, "over TCP")
	f("truncated over TCP too", func(req []byte, tcp bool) [][]byte {
		return [][]byte{answerTo(req, func(h *dnsmessage.Header) { h.Truncated = true }, nil)}
	}, "over TCP: the answer is truncated")
	f("truncated, wrong ID over TCP", func(req []byte, tcp bool) [][]byte {
		m := answerTo(req, func(h *dnsmessage.Header) { h.Truncated = !tcp }, aRecord)
		if tcp {
			m[1] ^= 1
		}
		return [][]byte{m}
	}, "over TCP")
}

// pointerLoop is the answer to req with one A record whose owner name is a chain of n compression
// pointers, the last pointing at itself.
func pointerLoop(req []byte, n int) []byte {
	m := answerTo(req, nil, nil)
	m[7] = 1 // ANCOUNT
	start := len(m)
	for i := 0; i < n; i++ {
		off := start + 2*(i+1)
		if i == n-1 {
			off = start + 2*i
		}
		m = append(m, 0xc0|byte(off>>8), byte(off))
	}
	return append(m, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 127, 0, 0, 1)
}

// TestHostileWatch reports a server that answers garbage with Fail, never a Set.
func TestHostileWatch(t *testing.T) {
	s := newFakeServer(t, func(req []byte, _ bool) [][]byte { return [][]byte{pointerLoop(req, 1)} })
	r := startWatch(t, hostileWatcher(t, s))
	for range 3 {
		if err := r.nextFail(t, within); !strings.Contains(err.Error(), "too many pointers") {
			t.Fatalf("Fail(%v), want the parse error", err)
		}
	}
}

// TestWatchReturnsWhenDone returns from Watch as soon as its context is done, though a query is waiting
// on a server that never answers with a timeout far longer.
func TestWatchReturnsWhenDone(t *testing.T) {
	asked := make(chan struct{}, 100)
	s := newFakeServer(t, func([]byte, bool) [][]byte { asked <- struct{}{}; return nil })
	sc := source(config.RecordA, "web.test", s.addr(), 0.2)
	sc.DNS.TimeoutSecs = 60
	w := newWatcher(t, sc, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Watch(ctx, &recorder{events: make(chan event, 10)}); close(done) }()
	<-asked
	before := runtime.NumGoroutine()
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch still waits on the query 10s after its context was done")
	}
	for deadline := time.Now().Add(5 * time.Second); runtime.NumGoroutine() >= before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines after Watch returned, %d while it ran: it left one behind", runtime.NumGoroutine(), before)
		}
	}
}

// TestSRVWithoutAdditional asks for an SRV target's addresses when the answer does not give them, and
// follows CNAMEs to them.
func TestSRVWithoutAdditional(t *testing.T) {
	s := newFakeServer(t, func(req []byte, _ bool) [][]byte {
		_, q, err := parseQuery(req)
		if err != nil {
			return nil
		}
		var add func(b *dnsmessage.Builder) error
		switch {
		case q.Type == dnsmessage.TypeSRV:
			add = func(b *dnsmessage.Builder) error {
				return errors.Join(
					b.SRVResource(rr("_http._tcp.svc.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: dnsmessage.MustNewName("A.svc.test."), Port: 8000}),
					b.SRVResource(rr("_http._tcp.svc.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: dnsmessage.MustNewName("."), Port: 8001}),
					b.SRVResource(rr("_http._tcp.svc.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: dnsmessage.MustNewName("b.svc.test."), Port: 0}))
			}
		case q.Type == dnsmessage.TypeA && strings.EqualFold(q.Name.String(), "a.svc.test."):
			add = func(b *dnsmessage.Builder) error {
				return errors.Join(
					b.CNAMEResource(rr("a.svc.test.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("pod.test.")}),
					b.AResource(rr("pod.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{127, 0, 0, 21}}),
					b.AResource(rr("other.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{127, 0, 0, 99}}))
			}
		}
		return [][]byte{answerTo(req, nil, add)}
	})
	r := startWatch(t, newWatcher(t, source(config.RecordSRV, "_http._tcp.svc.test", s.addr(), 0.2), Options{}))
	r.awaitSet(t, within, "A.svc.test 127.0.0.21:8000")
}

// TestRoundBounded fails a round that would ask for many SRV targets, each answered just in time, after
// roundTimeouts timeouts, not one per query.
func TestRoundBounded(t *testing.T) {
	s := newFakeServer(t, func(req []byte, _ bool) [][]byte {
		_, q, err := parseQuery(req)
		if err != nil {
			return nil
		}
		if q.Type != dnsmessage.TypeSRV {
			time.Sleep(40 * time.Millisecond)
			return [][]byte{answerTo(req, nil, nil)}
		}
		return [][]byte{answerTo(req, nil, func(b *dnsmessage.Builder) error {
			for i := range 100 {
				target := dnsmessage.MustNewName(fmt.Sprintf("t%d.svc.test.", i))
				if err := b.SRVResource(rr("_http._tcp.svc.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: target, Port: 8000}); err != nil {
					return err
				}
			}
			return nil
		})}
	})
	sc := source(config.RecordSRV, "_http._tcp.svc.test", s.addr(), 0.2)
	sc.DNS.TimeoutSecs = 0.1
	r := startWatch(t, newWatcher(t, sc, Options{}))
	if err := r.nextFail(t, within); !strings.Contains(err.Error(), "cannot finish a round within 800ms") {
		t.Fatalf("Fail(%v), want the round's bound", err)
	}
}
