package dnssrc

import (
	"fmt"
	"math/rand/v2"

	"golang.org/x/net/dns/dnsmessage"
)

// question is what one query asks: the records of one type of one name, in class IN.
type question struct {
	name dnsmessage.Name // fully qualified, with the trailing dot
	typ  dnsmessage.Type
}

// newQuestion returns the question for host's records of type typ; host may lack its trailing dot.
func newQuestion(host string, typ dnsmessage.Type) (question, error) {
	if host == "" {
		return question{}, fmt.Errorf("cannot ask for an empty name")
	}
	if host[len(host)-1] != '.' {
		host += "."
	}
	n, err := dnsmessage.NewName(host)
	if err != nil {
		return question{}, fmt.Errorf("cannot ask for %q: %w", host, err)
	}
	return question{name: n, typ: typ}, nil
}

// pack returns the query for q with id, after two bytes left for the length prefix a query over TCP
// needs (RFC 1035 section 4.2.2); over UDP the query is the bytes after them. It fails for a name that
// does not pack (a label longer than 63 bytes, an empty label).
func (q question) pack(id uint16) ([]byte, error) {
	b := dnsmessage.NewBuilder(make([]byte, 2, 2+12+int(q.name.Length)+2+4), dnsmessage.Header{ID: id, RecursionDesired: true})
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(dnsmessage.Question{Name: q.name, Type: q.typ, Class: dnsmessage.ClassINET}); err != nil {
		return nil, fmt.Errorf("cannot ask for %q: %w", q.name.String(), err)
	}
	msg, err := b.Finish()
	if err != nil {
		return nil, fmt.Errorf("cannot ask for %q: %w", q.name.String(), err)
	}
	l := len(msg) - 2
	msg[0], msg[1] = byte(l>>8), byte(l)
	return msg, nil
}

// matches reports whether an answer's question is q: same type and class, same name but for ASCII case
// (RFC 4343).
func (q question) matches(aq dnsmessage.Question) bool {
	return aq.Type == q.typ && aq.Class == dnsmessage.ClassINET && nameKey(aq.Name) == nameKey(q.name)
}

// String is q for errors: "svc.example. SRV".
func (q question) String() string {
	return q.name.String() + " " + typeName(q.typ)
}

// typeName is the record type's mnemonic without dnsmessage's "Type" prefix.
func typeName(t dnsmessage.Type) string {
	switch t {
	case dnsmessage.TypeA:
		return "A"
	case dnsmessage.TypeAAAA:
		return "AAAA"
	case dnsmessage.TypeSRV:
		return "SRV"
	}
	return t.String()
}

// newID returns a random query ID, so an off-path sender must guess it (with the source port the kernel
// picks at random) to have a forged answer taken.
func newID() uint16 { return uint16(rand.Uint32()) }

// nameKey is n in ASCII lower case, with its trailing dot: the key names are compared by.
func nameKey(n dnsmessage.Name) string {
	b := n.Data[:n.Length]
	out := make([]byte, len(b))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return string(out)
}
