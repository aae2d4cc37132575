package dnssrc

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// query is the query a Watcher sends for name's records of type typ, with id.
func query(t testing.TB, name string, typ dnsmessage.Type, id uint16) (question, []byte) {
	t.Helper()
	q, err := newQuestion(name, typ)
	if err != nil {
		t.Fatal(err)
	}
	req, err := q.pack(id)
	if err != nil {
		t.Fatal(err)
	}
	return q, req[2:]
}

func TestParseAnswer(t *testing.T) {
	f := func(name string, typ dnsmessage.Type, add func(b *dnsmessage.Builder) error, want []string, wantTTL ttl) {
		t.Helper()
		q, req := query(t, name, typ, 7)
		a, err := parseAnswer(answerTo(req, nil, add), 7, q)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var tt ttl
		var got []string
		for _, r := range a.ofType(typ, a.owners(nameKey(q.name), &tt), &tt) {
			if typ == dnsmessage.TypeSRV {
				got = append(got, displayName(r.name))
				continue
			}
			got = append(got, r.addr.String())
		}
		if len(got) == 0 {
			tt.seeAll(a.negTTL)
		}
		if !slices.Equal(got, want) || tt != wantTTL {
			t.Errorf("%s: got %q, TTL %+v; want %q, TTL %+v", name, got, tt, want, wantTTL)
		}
	}
	a := func(owner string, ttl uint32, ip ...byte) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error {
			h := rr(owner, dnsmessage.TypeA)
			h.TTL = ttl
			return b.AResource(h, dnsmessage.AResource{A: [4]byte(ip)})
		}
	}
	both := func(fs ...func(b *dnsmessage.Builder) error) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error {
			for _, f := range fs {
				if err := f(b); err != nil {
					return err
				}
			}
			return nil
		}
	}
	cname := func(owner, target string, ttl uint32) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error {
			h := rr(owner, dnsmessage.TypeCNAME)
			h.TTL = ttl
			return b.CNAMEResource(h, dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName(target)})
		}
	}
	soa := func(ttl, minTTL uint32) func(b *dnsmessage.Builder) error {
		return func(b *dnsmessage.Builder) error {
			h := rr("test.", dnsmessage.TypeSOA)
			h.TTL = ttl
			return errors.Join(b.StartAuthorities(), b.SOAResource(h, dnsmessage.SOAResource{
				NS: dnsmessage.MustNewName("ns.test."), MBox: dnsmessage.MustNewName("me.test."), MinTTL: minTTL}))
		}
	}
	f("web.test", dnsmessage.TypeA, nil, nil, ttl{})
	f("web.test", dnsmessage.TypeA, a("web.test.", 5, 10, 0, 0, 1), []string{"10.0.0.1"}, ttl{5, true})
	f("web.test", dnsmessage.TypeA, a("WEB.Test.", 5, 10, 0, 0, 1), []string{"10.0.0.1"}, ttl{5, true})
	f("web.test", dnsmessage.TypeA, both(a("web.test.", 5, 10, 0, 0, 1), a("web.test.", 3, 10, 0, 0, 2)), []string{"10.0.0.1", "10.0.0.2"}, ttl{3, true})
	f("web.test", dnsmessage.TypeA, a("other.test.", 5, 10, 0, 0, 1), nil, ttl{})
	f("web.test", dnsmessage.TypeA, both(cname("web.test.", "pod.test.", 2), a("pod.test.", 5, 10, 0, 0, 1)), []string{"10.0.0.1"}, ttl{2, true})
	f("web.test", dnsmessage.TypeA, both(a("pod.test.", 5, 10, 0, 0, 1), cname("web.test.", "pod.test.", 9)), []string{"10.0.0.1"}, ttl{5, true})
	f("web.test", dnsmessage.TypeA, both(cname("web.test.", "b.test.", 9), cname("b.test.", "web.test.", 9)), nil, ttl{9, true})
	f("web.test", dnsmessage.TypeA, soa(60, 4), nil, ttl{4, true})
	f("web.test", dnsmessage.TypeA, both(a("web.test.", 5, 10, 0, 0, 1), soa(60, 4)), []string{"10.0.0.1"}, ttl{5, true})
	f("_x._tcp.test", dnsmessage.TypeSRV, func(b *dnsmessage.Builder) error {
		return b.SRVResource(rr("_x._tcp.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: dnsmessage.MustNewName("a.test."), Port: 1})
	}, []string{"a.test"}, ttl{1, true})
}

// TestParseAnswerTooMany refuses an answer of more records than maxRecords.
func TestParseAnswerTooMany(t *testing.T) {
	q, req := query(t, "web.test", dnsmessage.TypeA, 7)
	msg := answerTo(req, nil, func(b *dnsmessage.Builder) error {
		for i := range maxRecords + 1 {
			if err := b.AResource(rr("web.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{10, 0, byte(i >> 8), byte(i)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if _, err := parseAnswer(msg, 7, q); err == nil {
		t.Fatalf("an answer of %d records parsed", maxRecords+1)
	}
}

// TestParseAnswerStray tells what is not the answer to the query from an answer that does not parse.
func TestParseAnswerStray(t *testing.T) {
	f := func(name string, edit func(m []byte) []byte, wantStray bool) {
		t.Helper()
		q, req := query(t, "web.test", dnsmessage.TypeA, 7)
		_, err := parseAnswer(edit(answerTo(req, nil, aRecord)), 7, q)
		if err == nil || errors.Is(err, errStray) != wantStray {
			t.Errorf("%s: %v, want an error, stray %t", name, err, wantStray)
		}
	}
	f("empty", func([]byte) []byte { return nil }, true)
	f("header only", func(m []byte) []byte { return m[:12] }, true)
	f("wrong ID", func(m []byte) []byte { m[1]++; return m }, true)
	f("not a response", func(m []byte) []byte { m[2] &^= 0x80; return m }, true)
	f("opcode", func(m []byte) []byte { m[2] |= 0x10; return m }, true)
	f("two questions", func(m []byte) []byte { m[5] = 2; return m }, true)
	f("other type", func(m []byte) []byte { m[12+10] = 28; return m }, true)
	f("other class", func(m []byte) []byte { m[12+12] = 3; return m }, true)
	f("cut in a record", func(m []byte) []byte { return m[:len(m)-1] }, false)
	f("one record too many", func(m []byte) []byte { m[7] = 2; return m }, false)
}

// FuzzAnswer holds the parser and what reads its answers to never panicking, and to answers that keep
// within its bounds, whatever the server's bytes. The ID and question are taken from the input, so the
// fuzzer reaches past the header checks.
func FuzzAnswer(f *testing.F) {
	for _, seed := range answerSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		id, aq, err := parseQuery(msg)
		if err != nil {
			id, aq = 0, dnsmessage.Question{Name: dnsmessage.MustNewName("web.test."), Type: dnsmessage.TypeA}
		}
		q := question{name: aq.Name, typ: aq.Type}
		a, err := parseAnswer(msg, id, q)
		if err != nil {
			return
		}
		if n := len(a.records) + len(a.extra); n > maxRecords {
			t.Fatalf("%d records, more than %d", n, maxRecords)
		}
		var tt ttl
		owners := a.owners(nameKey(q.name), &tt)
		if len(owners) > maxCNAMEs+1 {
			t.Fatalf("%d owners, more than %d", len(owners), maxCNAMEs+1)
		}
		for _, r := range a.ofType(dnsmessage.TypeA, owners, &tt) {
			if !r.addr.Is4() {
				t.Fatalf("A record of %s", r.addr)
			}
		}
		var res resolution
		for _, g := range groupTargets(a.ofType(dnsmessage.TypeSRV, owners, &tt), &res) {
			w := &Watcher{check: Options{}.checker()}
			w.addEndpoints(&res, displayName(g.name), a.extraAddrs(nameKey(g.name), &tt), g.ports[0])
		}
		newEndpointSet(res.eps)
	})
}

// answerSeeds are FuzzAnswer's seeds: answers of every shape a Watcher reads, and broken ones.
func answerSeeds(t testing.TB) [][]byte {
	_, reqA := query(t, "web.test", dnsmessage.TypeA, 7)
	_, reqSRV := query(t, "_http._tcp.svc.test", dnsmessage.TypeSRV, 8)
	srv := answerTo(reqSRV, nil, func(b *dnsmessage.Builder) error {
		return errors.Join(
			b.SRVResource(rr("_http._tcp.svc.test.", dnsmessage.TypeSRV), dnsmessage.SRVResource{Target: dnsmessage.MustNewName("a.svc.test."), Port: 8000}),
			b.StartAdditionals(),
			b.AResource(rr("a.svc.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{10, 0, 0, 1}}),
			b.AAAAResource(rr("a.svc.test.", dnsmessage.TypeAAAA), dnsmessage.AAAAResource{AAAA: netip.MustParseAddr("fd00::1").As16()}))
	})
	cnamed := answerTo(reqA, nil, func(b *dnsmessage.Builder) error {
		return errors.Join(
			b.CNAMEResource(rr("web.test.", dnsmessage.TypeCNAME), dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("pod.test.")}),
			b.AResource(rr("pod.test.", dnsmessage.TypeA), dnsmessage.AResource{A: [4]byte{10, 0, 0, 2}}))
	})
	return [][]byte{
		answerTo(reqA, nil, aRecord),
		answerTo(reqA, func(h *dnsmessage.Header) { h.RCode = dnsmessage.RCodeNameError }, nil),
		answerTo(reqA, func(h *dnsmessage.Header) { h.Truncated = true }, nil),
		srv, cnamed,
		pointerLoop(reqA, 1),
		pointerLoop(reqA, 12),
		reqA,
		{},
	}
}
