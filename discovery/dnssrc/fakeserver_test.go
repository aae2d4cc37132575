package dnssrc

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// fakeServer is a DNS server of the test's own on a loopback port, over UDP and TCP, answering each query
// with the messages reply makes of it: the answers, broken or hostile, dnsmasq does not give.
type fakeServer struct {
	pc    net.PacketConn
	ln    net.Listener
	reply func(req []byte, tcp bool) [][]byte
	wg    sync.WaitGroup
}

// newFakeServer starts a server answering with reply; it stops at cleanup.
func newFakeServer(t *testing.T, reply func(req []byte, tcp bool) [][]byte) *fakeServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		_ = pc.Close()
		t.Skipf("cannot listen on TCP at the UDP port %s: %v", pc.LocalAddr(), err)
	}
	s := &fakeServer{pc: pc, ln: ln, reply: reply}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	t.Cleanup(func() { _ = pc.Close(); _ = ln.Close(); s.wg.Wait() })
	return s
}

// addr is the server's "127.0.0.1:port".
func (s *fakeServer) addr() string { return s.pc.LocalAddr().String() }

func (s *fakeServer) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 512)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return
		}
		for _, m := range s.reply(append([]byte(nil), buf[:n]...), false) {
			_, _ = s.pc.WriteTo(m, from)
		}
	}
}

func (s *fakeServer) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.serveConn(c)
	}
}

// serveConn answers one query on c, each message with its length prefix.
func (s *fakeServer) serveConn(c net.Conn) {
	defer c.Close()
	req, err := readTCPMessage(c)
	if err != nil {
		return
	}
	for _, m := range s.reply(req, true) {
		var l [2]byte
		binary.BigEndian.PutUint16(l[:], uint16(len(m)))
		_, _ = c.Write(append(l[:], m...))
	}
	_, _ = io.Copy(io.Discard, c)
}

// parseQuery returns a query's ID and question.
func parseQuery(req []byte) (uint16, dnsmessage.Question, error) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return 0, dnsmessage.Question{}, err
	}
	q, err := p.Question()
	return h.ID, q, err
}

// answerTo builds the answer to req: its ID and question, header edited by hdr, the records add writes
// (starting in the answer section).
func answerTo(req []byte, hdr func(h *dnsmessage.Header), add func(b *dnsmessage.Builder) error) []byte {
	id, q, err := parseQuery(req)
	if err != nil {
		return nil
	}
	h := dnsmessage.Header{ID: id, Response: true, Authoritative: true}
	if hdr != nil {
		hdr(&h)
	}
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	err = errors.Join(b.StartQuestions(), b.Question(q), b.StartAnswers())
	if err == nil && add != nil {
		err = add(&b)
	}
	msg, ferr := b.Finish()
	if err != nil || ferr != nil {
		panic(errors.Join(err, ferr))
	}
	return msg
}

// rr is a record header of name, type typ, TTL 1.
func rr(name string, typ dnsmessage.Type) dnsmessage.ResourceHeader {
	return dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET, TTL: 1}
}
