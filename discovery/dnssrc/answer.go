package dnssrc

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/net/dns/dnsmessage"
)

// Bounds on what one answer makes a Watcher do: however the server's bytes are made, parsing one is
// linear in its size (at most 64 KiB over TCP), and what follows from it is bounded by these.
const (
	// maxRecords bounds the records one answer may hold, in all sections: 4096 is about what 64 KiB of
	// compressed A records hold.
	maxRecords = 4096
	// maxCNAMEs bounds the CNAME hops followed from the question's name.
	maxCNAMEs = 8
)

// errStray marks a datagram that is not the answer to the query: it does not parse as a DNS header and
// question, or its ID or question is another's. Over UDP it is dropped and the answer still awaited (an
// off-path forgery, a late answer to an earlier query).
var errStray = errors.New("not the answer to the query")

// answer is what one DNS answer says, parsed. Its records are copies: it holds nothing of the message.
type answer struct {
	rcode     dnsmessage.RCode
	truncated bool
	// records are the A, AAAA, SRV and CNAME records of the answer section, in class IN.
	records []record
	// extra are the A and AAAA records of the additional section (an SRV target's addresses).
	extra []record
	// negTTL is how long the answer's SOA says an empty answer holds (RFC 2308 section 5), if it has one.
	negTTL ttl
}

// record is one resource record of a type a Watcher uses.
type record struct {
	owner string // nameKey of the owner name
	typ   dnsmessage.Type
	ttl   uint32
	addr  netip.Addr      // A, AAAA
	port  uint16          // SRV
	name  dnsmessage.Name // SRV target, CNAME target
}

// parseAnswer parses msg as the answer to the query q with id. It returns an error wrapping errStray
// for a message that is not that answer, and another error for one that is but does not parse. Of a
// truncated answer, or one whose RCODE is an error, only the header counts. It never panics, whatever msg
// holds.
func parseAnswer(msg []byte, id uint16, q question) (*answer, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errStray, err)
	}
	if err := checkHeader(&p, h, id, q); err != nil {
		return nil, err
	}
	a := &answer{rcode: h.RCode, truncated: h.Truncated}
	if a.truncated || (a.rcode != dnsmessage.RCodeSuccess && a.rcode != dnsmessage.RCodeNameError) {
		return a, nil
	}
	if err := a.parseSections(&p); err != nil {
		return nil, fmt.Errorf("cannot parse the answer to %s: %w", q, err)
	}
	return a, nil
}

// checkHeader reports, as errStray, a header that is not the answer to q with id: not a response, another
// ID or opcode, or not exactly q as its only question.
func checkHeader(p *dnsmessage.Parser, h dnsmessage.Header, id uint16, q question) error {
	if !h.Response || h.ID != id || h.OpCode != 0 {
		return fmt.Errorf("%w: ID %d, response %t, opcode %d", errStray, h.ID, h.Response, h.OpCode)
	}
	aq, err := p.Question()
	if err != nil {
		return fmt.Errorf("%w: %w", errStray, err)
	}
	if !q.matches(aq) {
		return fmt.Errorf("%w: question %q %s", errStray, aq.Name.String(), typeName(aq.Type))
	}
	if _, err := p.Question(); !errors.Is(err, dnsmessage.ErrSectionDone) {
		return fmt.Errorf("%w: more than one question", errStray)
	}
	return nil
}

// parseSections reads the answer, authority and additional sections, keeping what a Watcher uses.
func (a *answer) parseSections(p *dnsmessage.Parser) error {
	n := 0
	for {
		r, ok, err := nextRecord(p, section{p.AnswerHeader, p.SkipAnswer}, &n)
		if err != nil {
			return fmt.Errorf("answer section: %w", err)
		}
		if !ok {
			break
		}
		if r.typ != 0 {
			a.records = append(a.records, r)
		}
	}
	if err := a.parseAuthority(p, &n); err != nil {
		return fmt.Errorf("authority section: %w", err)
	}
	for {
		r, ok, err := nextRecord(p, section{p.AdditionalHeader, p.SkipAdditional}, &n)
		if err != nil {
			return fmt.Errorf("additional section: %w", err)
		}
		if !ok {
			return nil
		}
		if r.typ == dnsmessage.TypeA || r.typ == dnsmessage.TypeAAAA {
			a.extra = append(a.extra, r)
		}
	}
}

// parseAuthority reads the authority section for its SOA, whose TTL and MINIMUM bound how long an empty
// answer holds.
func (a *answer) parseAuthority(p *dnsmessage.Parser, n *int) error {
	for {
		h, err := p.AuthorityHeader()
		if errors.Is(err, dnsmessage.ErrSectionDone) {
			return nil
		}
		if err != nil {
			return err
		}
		if *n++; *n > maxRecords {
			return fmt.Errorf("more than %d records", maxRecords)
		}
		if h.Type != dnsmessage.TypeSOA || h.Class != dnsmessage.ClassINET {
			if err := p.SkipAuthority(); err != nil {
				return err
			}
			continue
		}
		soa, err := p.SOAResource()
		if err != nil {
			return err
		}
		a.negTTL.see(min(h.TTL, soa.MinTTL))
	}
}

// section is how a Parser reads one section's records: the next header, or past the next body.
type section struct {
	header func() (dnsmessage.ResourceHeader, error)
	skip   func() error
}

// nextRecord reads the next record of sec, counting it in n. It returns ok false at the section's end,
// and a record of type 0 for one of a type or class a Watcher does not use (skipped).
func nextRecord(p *dnsmessage.Parser, sec section, n *int) (record, bool, error) {
	h, err := sec.header()
	if errors.Is(err, dnsmessage.ErrSectionDone) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	if *n++; *n > maxRecords {
		return record{}, false, fmt.Errorf("more than %d records", maxRecords)
	}
	r, err := readRecord(p, h, sec.skip)
	return r, err == nil, err
}

// readRecord reads the body of the record whose header is h: A, AAAA, SRV and CNAME in class IN are kept,
// anything else is skipped.
func readRecord(p *dnsmessage.Parser, h dnsmessage.ResourceHeader, skip func() error) (record, error) {
	r := record{owner: nameKey(h.Name), typ: h.Type, ttl: h.TTL}
	if h.Class != dnsmessage.ClassINET {
		return record{}, skip()
	}
	switch h.Type {
	case dnsmessage.TypeA:
		b, err := p.AResource()
		r.addr = netip.AddrFrom4(b.A)
		return r, err
	case dnsmessage.TypeAAAA:
		b, err := p.AAAAResource()
		r.addr = netip.AddrFrom16(b.AAAA).Unmap()
		return r, err
	case dnsmessage.TypeSRV:
		b, err := p.SRVResource()
		r.port, r.name = b.Port, b.Target
		return r, err
	case dnsmessage.TypeCNAME:
		b, err := p.CNAMEResource()
		r.name = b.CNAME
		return r, err
	}
	return record{}, skip()
}

// owners returns the names whose records answer a question for name: name, and the targets of the CNAME
// chain from it (RFC 1034 section 3.6.2), at most maxCNAMEs hops, each record's TTL seen by t.
func (a *answer) owners(name string, t *ttl) []string {
	names := []string{name}
	for cur := name; len(names) <= maxCNAMEs; {
		next, ok := a.cname(cur, t)
		if !ok || slices.Contains(names, next) {
			break
		}
		names = append(names, next)
		cur = next
	}
	return names
}

// cname returns the target of owner's CNAME record in the answer section, with its TTL seen by t.
func (a *answer) cname(owner string, t *ttl) (string, bool) {
	for _, r := range a.records {
		if r.typ == dnsmessage.TypeCNAME && r.owner == owner {
			t.see(r.ttl)
			return nameKey(r.name), true
		}
	}
	return "", false
}

// ofType returns the answer section's records of type typ owned by one of owners, each TTL seen by t.
func (a *answer) ofType(typ dnsmessage.Type, owners []string, t *ttl) []record {
	var out []record
	for _, r := range a.records {
		if r.typ == typ && slices.Contains(owners, r.owner) {
			t.see(r.ttl)
			out = append(out, r)
		}
	}
	return out
}

// extraAddrs returns the addresses the additional section gives owner, each TTL seen by t.
func (a *answer) extraAddrs(owner string, t *ttl) []netip.Addr {
	var out []netip.Addr
	for _, r := range a.extra {
		if r.owner == owner {
			t.see(r.ttl)
			out = append(out, r.addr)
		}
	}
	return out
}
