// Command refproxy is a yardstick for the instruction count and the overhead report (bench/README.md): the
// least an HTTP/1.1 keep-alive proxy written in Go does per request, with nothing of a gateway - no
// routing, no JSON, no timeouts, no metrics, no hardening. It frames messages by Content-Length only (the
// fake upstream's answers), and is not for any other use.
//
//	-mode goroutine: a goroutine per client connection on Go's net package, one upstream connection each
//	 (the overhead report's null-net);
//	-mode fasthttp: fasthttp's server (ReduceMemoryUsage, as `rolter serve` sets it), the request written
//	 to a pooled upstream connection as fasthttp parsed it (sent again once, on a new connection, when a
//	 pooled one turns out closed), the answer's body set as the response body (null-fasthttp);
//	-mode lean: the same relay without fasthttp's server: a goroutine per client connection, fasthttp's
//	 Request and Response to parse and write, every socket read armed before the write it waits on
//	 (null-lean; serveLean).
//
//	go run ./bench/cmd/refproxy -mode fasthttp -listen 127.0.0.1:8080 -upstream 127.0.0.1:9000
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"

	"github.com/valyala/fasthttp"
)

func main() {
	mode := flag.String("mode", "goroutine", "goroutine, fasthttp or lean")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	upstream := flag.String("upstream", "", "upstream host:port")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil || *upstream == "" {
		fmt.Fprintln(os.Stderr, "refproxy: need -upstream and a free -listen address:", err)
		os.Exit(2)
	}
	switch *mode {
	case "goroutine":
		for {
			c, err := ln.Accept()
			if err != nil {
				os.Exit(1)
			}
			go serveConn(c, *upstream)
		}
	case "fasthttp":
		s := &fasthttp.Server{Handler: fasthttpHandler(*upstream), ReduceMemoryUsage: true}
		_ = s.Serve(ln)
		os.Exit(1)
	case "lean":
		_ = serveLean(ln, *upstream)
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "refproxy: -mode is goroutine, fasthttp or lean")
		os.Exit(2)
	}
}

// serveConn relays whole messages between a client connection and its own upstream connection.
func serveConn(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer u.Close()
	buf := make([]byte, 64<<10)
	var in, back []byte
	for {
		var m int
		if in, m = readMessage(c, in, buf); m <= 0 {
			return
		}
		if _, err := u.Write(in[:m]); err != nil {
			return
		}
		in = in[:copy(in, in[m:])]
		var k int
		if back, k = readMessage(u, back, buf); k <= 0 {
			return
		}
		if _, err := c.Write(back[:k]); err != nil {
			return
		}
		back = back[:copy(back, back[k:])]
	}
}

// readMessage reads from c into acc until acc holds a whole message and returns acc and that message's
// length (0: the connection ended first).
func readMessage(c net.Conn, acc, buf []byte) ([]byte, int) {
	for {
		if m := messageLen(acc); m > 0 {
			return acc, m
		}
		n, err := c.Read(buf)
		acc = append(acc, buf[:n]...)
		if err != nil {
			return acc, 0
		}
	}
}

// messageLen is the length of the whole message (head and Content-Length body) at the start of b, or 0.
func messageLen(b []byte) int {
	h := bytes.Index(b, []byte("\r\n\r\n"))
	if h < 0 {
		return 0
	}
	head := b[:h+2]
	n := 0
	for off := 0; ; {
		i := bytes.Index(head[off:], []byte("ontent-")) // Content-Length in any case, found by its middle
		if i < 0 {
			break
		}
		i += off
		off = i + 1
		if i < 3 || head[i-3] != '\r' || head[i-2] != '\n' || head[i-1]|0x20 != 'c' ||
			len(head) < i+14 || !bytes.EqualFold(head[i+7:i+14], []byte("length:")) {
			continue
		}
		for j := i + 14; j < len(head) && head[j] != '\r'; j++ {
			if c := head[j]; '0' <= c && c <= '9' {
				n = n*10 + int(c-'0')
			}
		}
		break
	}
	if len(b) < h+4+n {
		return 0
	}
	return h + 4 + n
}

type upstreamConn struct {
	c        net.Conn
	rc       syscall.RawConn // -mode lean's
	out, acc []byte
	buf      []byte
}

// connPool holds idle upstream connections. (Not a sync.Pool: that drops what it holds at every GC, and
// the connections it dropped would stay open, one per request in flight, until the upstream closes them.)
type connPool struct {
	mu   sync.Mutex
	idle []*upstreamConn
}

func (p *connPool) get() *upstreamConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	u := p.idle[n-1]
	p.idle = p.idle[:n-1]
	return u
}

// take returns an idle connection on a request's first try, pooled true, or else dials a new one.
func (p *connPool) take(try int, upstream string) (u *upstreamConn, pooled bool, err error) {
	if try == 0 {
		if u = p.get(); u != nil {
			return u, true, nil
		}
	}
	c, err := net.Dial("tcp", upstream)
	if err != nil {
		return nil, false, err
	}
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		c.Close()
		return nil, false, err
	}
	return &upstreamConn{c: c, rc: rc, buf: make([]byte, 64<<10)}, false, nil
}

func (p *connPool) put(u *upstreamConn) {
	p.mu.Lock()
	p.idle = append(p.idle, u)
	p.mu.Unlock()
}

// fasthttpHandler forwards each request on a pooled upstream connection.
func fasthttpHandler(upstream string) fasthttp.RequestHandler {
	var pool connPool
	return func(ctx *fasthttp.RequestCtx) {
		// A pooled connection the upstream closed while it was idle (its keep-alive timeout) fails at once:
		// the request is sent again, once, on a new connection, as every proxy does.
		for try := 0; ; try++ {
			u, pooled, err := pool.take(try, upstream)
			if err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
				return
			}
			u.out = ctx.Request.Header.AppendBytes(u.out[:0])
			u.out = append(u.out, ctx.Request.Body()...)
			_, err = u.c.Write(u.out)
			var k int
			if err == nil {
				u.acc, k = readMessage(u.c, u.acc, u.buf)
			}
			if k <= 0 {
				u.c.Close()
				if pooled && len(u.acc) == 0 { // only the first try takes a pooled connection
					continue
				}
				ctx.Error("upstream failed", fasthttp.StatusBadGateway)
				return
			}
			h := bytes.Index(u.acc, []byte("\r\n\r\n"))
			ctx.SetContentType("application/json")
			ctx.SetBody(u.acc[h+4 : k])
			u.acc = u.acc[:copy(u.acc, u.acc[k:])]
			pool.put(u)
			return
		}
	}
}
