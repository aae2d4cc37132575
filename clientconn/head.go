package clientconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// Read marks the connection active when a request's first bytes arrive. If the listener reclaimed it in
// between, the bytes are dropped and the connection reads as closed, as if the close had come first.
//
// fasthttp (with ReduceMemoryUsage) waits for a connection's first request - and, on a parked connection,
// for the next - by reading one byte, then reads the rest into a buffer it takes only then: two reads of a
// request that is usually whole in the socket. A small read on a plain socket therefore reads ahead: into
// a pooled buffer, taken only for the system call, so a waiting connection still holds none; the bytes past
// what was asked for are handed out by the reads that follow, which then make no system call.
//
// The read of a request's first byte (fasthttp's, on a fresh or parked connection) returns only once the
// request's head is whole in what was read, or headMax bytes of it came, or the wait ended (a deadline, a
// close): fasthttp takes its read buffer (max_header_bytes, 64 KiB by default) when that byte comes and
// keeps it until the head is read, so that a client sending a head slowly - or the first bytes of one, and
// nothing more - would hold it for up to read_timeout_secs. The bytes read meanwhile are held as received.
//
// A head whose lines end in a bare LF has no CRLF CRLF for fasthttp to wait for: its bytes are handed over
// once its empty line came, and the read after them fails with ErrBareLF, which the server answers with 400
// at once instead of at read_timeout_secs. So do bytes that cannot begin a request line (ErrNotRequest).
//
// A read that waits for the next request on an idle connection can be woken by parkIdle: it then reads as
// the end of the connection, so that fasthttp lets go of the connection and its buffers.
func (c *clientConn) Read(b []byte) (int, error) {
	if c.ahead != nil {
		return c.readBuffered(b), nil
	}
	if err := c.headErr; err != nil {
		c.headErr = nil
		return 0, err
	}
	s := c.state.Load()
	idle := s == connIdle
	if idle {
		c.idleRead.Store(true)
	}
	var n int
	var err error
	if c.readAhead != nil && len(b) > 0 && len(b) < smallRead {
		c.waitHead = len(b) == 1 && (s == connFresh || idle)
		n, err = c.readAheadInto(b)
		c.waitHead = false
	} else {
		n, err = c.Conn.Read(b)
		if n > 0 && (s == connFresh || idle || c.inHead) {
			c.watchHead(b[:n])
		}
	}
	if idle {
		c.idleRead.Store(false)
		if n == 0 && c.parkWanted.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
			c.parkNow.Store(true)
			return 0, io.EOF
		}
	}
	if n > 0 {
		if s := c.state.Load(); s != connActive && s != connHijacked && !c.activate() {
			c.dropAhead()
			return 0, net.ErrClosed
		}
	}
	return n, err
}

// readAheadInto reads what the socket holds (waiting for it if nothing does) into a pooled buffer and
// copies the start into b.
func (c *clientConn) readAheadInto(b []byte) (int, error) {
	c.aheadErr = nil
	if err := c.rc.Read(c.readAhead); err != nil {
		if len(c.head) == 0 {
			// Deadline, close: the plain read reports it as it always has.
			return c.Conn.Read(b)
		}
		// The wait for the rest of a head ended: what came of it is read, and the read that follows meets
		// the deadline or the close.
		c.aheadHead(aheadPool.Get().(*[aheadSize]byte))
	}
	if c.aheadErr != nil {
		if c.aheadErr == io.EOF {
			return 0, io.EOF
		}
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", c.aheadErr)}
	}
	return c.readBuffered(b), nil
}

// readAheadFD is the RawConn callback of readAheadInto: one non-blocking read, the buffer taken only
// while bytes come. When waitHead is set and they are not a whole request head, they are kept in head and
// it waits for the rest (headWaits).
func (c *clientConn) readAheadFD(fd uintptr) bool {
	buf := aheadPool.Get().(*[aheadSize]byte)
	for {
		n, err := syscall.Read(int(fd), buf[:aheadSize-len(c.head)])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			aheadPool.Put(buf)
			return false // wait until readable, then call again
		case err != nil || n == 0:
			if len(c.head) > 0 {
				// The head's bytes are read first; the read after them meets the end or the error again.
				return c.aheadHead(buf)
			}
			c.aheadErr = io.EOF
			if err != nil {
				c.aheadErr = err
			}
			aheadPool.Put(buf)
			return true
		case len(c.head) == 0 && !(c.waitHead && c.headWaits(buf[:n], 0)):
			c.ahead, c.aheadOff, c.aheadN = buf, 0, n
			return true
		}
		from := len(c.head)
		c.head = append(c.head, buf[:n]...)
		if from == 0 || c.headWaits(c.head, from) { // a first read got here because its head waits
			aheadPool.Put(buf)
			return false // wait for the rest of the head
		}
		return c.aheadHead(buf)
	}
}

// headMax is how much of a request head the wait for its end holds: aheadSize, or less when
// server.max_header_bytes is (the server then refuses the head at once).
func (c *clientConn) headMax() int {
	if m := c.l.headMax; m > 0 && m < aheadSize {
		return m
	}
	return aheadSize
}

// aheadHead makes the bytes in head the read-ahead, in buf.
func (c *clientConn) aheadHead(buf *[aheadSize]byte) bool {
	c.ahead, c.aheadOff, c.aheadN = buf, 0, copy(buf[:], c.head)
	c.head = nil
	return true
}

// headWaits reports whether the wait for the head in b, what came of a request so far (b[:from] looked at
// before), goes on: its empty line did not come, nor headMax bytes of it. A head that ends in a bare LF's
// empty line, or bytes that cannot begin a request line, end the wait with headErr set.
func (c *clientConn) headWaits(b []byte, from int) bool {
	ended, bare := headLines(b[max(from-3, 0):]) // a CRLF CRLF split between reads starts at most 3 bytes back
	switch {
	case ended || len(b) >= c.headMax():
		return false
	case bare:
		c.headErr = ErrBareLF
		return false
	case notRequestLine(b):
		c.headErr = ErrNotRequest
		return false
	}
	return true
}

// ErrBareLF is the error of the read after a request head whose lines end in a bare LF (see Read).
// RFC 9112 section 2.2 lets a server refuse them; a gateway that forwards the request refuses them rather
// than guess where a line ends differently from what sits in front of it.
var ErrBareLF = errors.New("request head lines end in a bare LF; HTTP/1.1 requires CRLF")

// ErrNotRequest is the error of the read after bytes that cannot begin a request line (see Read): a TLS
// handshake sent to a plain-HTTP port, say. fasthttp would wait for their end of line, or CRLF CRLF.
var ErrNotRequest = errors.New("the bytes received do not begin an HTTP request line")

// notRequestLine reports whether b, the start of what came for a request, cannot begin a request line: a
// byte that is no token character comes before the method's space. Empty lines before it are skipped, as
// fasthttp skips them.
func notRequestLine(b []byte) bool {
	for len(b) > 0 && (b[0] == '\r' || b[0] == '\n') {
		b = b[1:]
	}
	for i, c := range b {
		if c == ' ' {
			return i == 0
		}
		if !tokenChars[c] {
			return true
		}
	}
	return false
}

// watchHead looks at p, the bytes of a request head read straight into fasthttp's buffer: the next request
// on a keep-alive connection (fasthttp keeps its buffer between requests with streamed bodies), or any
// request over TLS. The watch ends at the head's CRLF CRLF; at an empty line ended by a bare LF, or at a first
// read that cannot begin a request line, the next read fails (ErrBareLF, ErrNotRequest).
func (c *clientConn) watchHead(p []byte) {
	first := !c.inHead
	if first {
		c.headTailN = 0 // a new head: what ended the last one is no line end of this one
	}
	c.inHead = false
	ended, bare := headLines(p)
	if c.headTailN > 0 && !ended {
		var edge [6]byte // the end of what came before and the start of p: a line end split between reads
		endedE, bareE := headLines(append(append(edge[:0], c.headTail[:c.headTailN]...), p[:min(len(p), 3)]...))
		ended, bare = ended || endedE, bare || bareE
	}
	switch {
	case ended:
		return
	case bare:
		c.headErr = ErrBareLF
		return
	case first && notRequestLine(p):
		c.headErr = ErrNotRequest
		return
	}
	c.inHead = true
	// Keep the last bytes of what came, p's or, when p is shorter, the previous tail's too.
	var all [6]byte
	t := append(append(all[:0], c.headTail[:c.headTailN]...), p[max(len(p)-len(c.headTail), 0):]...)
	c.headTailN = copy(c.headTail[:], t[max(len(t)-len(c.headTail), 0):])
}

// headLines walks the line ends of b, a head or a piece of one: ended when b holds a CRLF CRLF - the only end
// of a head fasthttp takes; the walk stops there - and bare when an empty line before it is ended by a bare
// LF (LF LF, or LF CRLF after a line ended by a bare LF). One IndexByte per line: it looks at every request's
// head (headWaits, watchHead).
func headLines(b []byte) (ended, bare bool) {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return false, bare
		}
		i += j + 1
		switch rest := b[i:]; {
		case len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n':
			if i >= 2 && b[i-2] == '\r' {
				return true, false
			}
			bare = true
		case len(rest) >= 1 && rest[0] == '\n':
			bare = true
		}
	}
}

// readBuffered hands out read-ahead bytes, and returns the buffer to the pool once they are all read.
func (c *clientConn) readBuffered(b []byte) int {
	n := copy(b, c.ahead[c.aheadOff:c.aheadN])
	c.aheadOff += n
	if c.aheadOff == c.aheadN {
		c.dropAhead()
	}
	return n
}

func (c *clientConn) dropAhead() {
	if c.ahead != nil {
		aheadPool.Put(c.ahead)
		c.ahead = nil
	}
}
