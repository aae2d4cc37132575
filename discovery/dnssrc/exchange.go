package dnssrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Bounds of one exchange with the DNS server.
const (
	// udpSize is the largest UDP answer read. Without EDNS(0) a server sends at most 512 bytes and sets TC
	// past them (RFC 1035 section 4.2.1); the slack takes servers that send more anyway.
	udpSize = 4096
	// maxStrays bounds the datagrams that are not the answer a query waits through before giving up.
	maxStrays = 8
)

// errTimeout wraps an exchange's deadline passing, so the error says which question went unanswered.
var errTimeout = errors.New("no answer in time")

// exchange asks the server q, over UDP, and over TCP again when the UDP answer is truncated. An answer
// whose RCODE is NXDOMAIN is an answer (the name has no records); any other RCODE but NOERROR is an error.
func (w *Watcher) exchange(ctx context.Context, q question) (*answer, error) {
	a, err := w.exchangeUDP(ctx, q)
	if err == nil && a.truncated {
		a, err = w.exchangeTCP(ctx, q)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot resolve %s at %s: %w", q, w.server, err)
	}
	if a.rcode != dnsmessage.RCodeSuccess && a.rcode != dnsmessage.RCodeNameError {
		return nil, fmt.Errorf("cannot resolve %s at %s: the server answered %s", q, w.server, rcodeName(a.rcode))
	}
	return a, nil
}

// exchangeUDP sends q in one datagram and reads until its answer comes, dropping up to maxStrays others.
func (w *Watcher) exchangeUDP(ctx context.Context, q question) (*answer, error) {
	id := newID()
	req, err := q.pack(id)
	if err != nil {
		return nil, err
	}
	c, done, err := w.connect(ctx, "udp")
	if err != nil {
		return nil, err
	}
	defer done()
	if _, err := c.Write(req[2:]); err != nil {
		return nil, ioError(ctx, err)
	}
	buf := make([]byte, udpSize)
	for strays := 0; ; strays++ {
		n, err := c.Read(buf)
		if err != nil {
			return nil, ioError(ctx, err)
		}
		a, err := parseAnswer(buf[:n], id, q)
		if !errors.Is(err, errStray) {
			return a, err
		}
		if strays == maxStrays {
			return nil, fmt.Errorf("%d datagrams that are not the answer, the last: %w", strays+1, err)
		}
	}
}

// exchangeTCP sends q over a connection of its own and reads the one answer (RFC 7766): an answer that is
// not q's, or is truncated, is an error there.
func (w *Watcher) exchangeTCP(ctx context.Context, q question) (*answer, error) {
	id := newID()
	req, err := q.pack(id)
	if err != nil {
		return nil, err
	}
	c, done, err := w.connect(ctx, "tcp")
	if err != nil {
		return nil, err
	}
	defer done()
	if _, err := c.Write(req); err != nil {
		return nil, ioError(ctx, err)
	}
	msg, err := readTCPMessage(c)
	if err != nil {
		return nil, ioError(ctx, err)
	}
	a, err := parseAnswer(msg, id, q)
	if err != nil {
		return nil, fmt.Errorf("over TCP: %w", err)
	}
	if a.truncated {
		return nil, errors.New("over TCP: the answer is truncated")
	}
	return a, nil
}

// readTCPMessage reads one length-prefixed message: at most 64 KiB, the most its prefix can say.
func readTCPMessage(r io.Reader) ([]byte, error) {
	var l [2]byte
	if _, err := io.ReadFull(r, l[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, int(l[0])<<8|int(l[1]))
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, err
	}
	return msg, nil
}

// connect dials the server over network with the exchange's deadline (the source's timeout) on the
// connection, and makes the connection's I/O return at once when ctx is done. done closes it.
func (w *Watcher) connect(ctx context.Context, network string) (net.Conn, func(), error) {
	deadline := time.Now().Add(w.timeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := w.dial(dctx, network, w.server)
	if err != nil {
		return nil, nil, ioError(ctx, err)
	}
	if err := c.SetDeadline(deadline); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	stop := interruptOnDone(ctx, c)
	return c, func() { stop(); _ = c.Close() }, nil
}

// interruptOnDone makes c's blocked reads and writes return when ctx is done, by moving its deadline to
// the past. The returned func undoes that, waiting for an interruption under way, so no goroutine outlives
// the exchange.
func interruptOnDone(ctx context.Context, c net.Conn) func() {
	interrupted := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.SetDeadline(time.Unix(1, 0))
		close(interrupted)
	})
	return func() {
		if !stop() {
			<-interrupted
		}
	}
}

// ioError is err, or ctx's error when ctx is done (the deadline moved to the past was its doing), or
// errTimeout for the exchange's own deadline.
func ioError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errTimeout
	}
	return err
}

// rcodeName is an RCODE's mnemonic (RFC 1035 section 4.1.1, RFC 6895 section 2.3).
func rcodeName(r dnsmessage.RCode) string {
	switch r {
	case dnsmessage.RCodeFormatError:
		return "FORMERR"
	case dnsmessage.RCodeServerFailure:
		return "SERVFAIL"
	case dnsmessage.RCodeNotImplemented:
		return "NOTIMP"
	case dnsmessage.RCodeRefused:
		return "REFUSED"
	}
	return fmt.Sprintf("RCODE %d", r)
}
