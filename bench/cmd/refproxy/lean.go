package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// serveLean is -mode lean: a goroutine per client connection, its requests parsed and its answers written
// with fasthttp's Request and Response, relayed over pooled upstream connections. Each socket's read is
// armed before the write that the bytes to read answer (the answer to the client before its next request,
// the request to the upstream before its answer), so no read finds the socket empty: the least a serving
// loop of a gateway's own, parsing heads as fasthttp does, costs per request.
func serveLean(ln net.Listener, upstream string) error {
	var pool connPool
	var date atomic.Pointer[string]
	setDate := func() { d := time.Now().UTC().Format(time.RFC1123); date.Store(&d) }
	setDate()
	go func() {
		for range time.Tick(time.Second) {
			setDate()
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveLeanConn(c, upstream, &pool, &date)
	}
}

// leanConn is a client connection whose bytes read while it waited for a request (armedWrite) are read
// first.
type leanConn struct {
	net.Conn
	pending []byte
	buf     []byte
}

func (l *leanConn) Read(p []byte) (int, error) {
	if len(l.pending) > 0 {
		n := copy(p, l.pending)
		l.pending = l.pending[n:]
		return n, nil
	}
	return l.Conn.Read(p)
}

func serveLeanConn(c net.Conn, upstream string, pool *connPool, date *atomic.Pointer[string]) {
	defer c.Close()
	sc, ok := c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	lc := &leanConn{Conn: c, buf: make([]byte, 16<<10)}
	br := bufio.NewReaderSize(lc, 4096)
	var out bytes.Buffer
	bw := bufio.NewWriterSize(&out, 4096)
	var req fasthttp.Request
	var resp fasthttp.Response
	for {
		req.Reset()
		if err := req.Read(br); err != nil {
			return
		}
		u, k, err := leanExchange(pool, upstream, &req)
		resp.Reset()
		resp.Header.SetServer("refproxy")
		resp.Header.Set("Date", *date.Load())
		if err != nil {
			resp.SetStatusCode(fasthttp.StatusBadGateway)
			resp.SetConnectionClose()
		} else {
			h := bytes.Index(u.acc, []byte("\r\n\r\n"))
			resp.Header.SetContentType("application/json")
			resp.SetBody(u.acc[h+4 : k])
			u.acc = u.acc[:copy(u.acc, u.acc[k:])]
			pool.put(u)
		}
		out.Reset()
		if resp.Write(bw) != nil || bw.Flush() != nil {
			return
		}
		if err != nil || br.Buffered() > 0 || len(lc.pending) > 0 {
			// A pipelined request is already read; a failed answer ends the connection.
			if _, werr := c.Write(out.Bytes()); werr != nil || err != nil {
				return
			}
			continue
		}
		if armedWrite(rc, out.Bytes(), func(fd int) (bool, error) {
			n, err := syscall.Read(fd, lc.buf)
			if n > 0 {
				lc.pending = lc.buf[:n]
				return true, nil
			}
			if err == nil {
				err = io.EOF
			}
			return false, err
		}) != nil {
			return
		}
	}
}

// leanExchange sends req on a pooled upstream connection (again once, on a new one, when a pooled one turns
// out closed) and returns the connection with the answer's length at the start of its acc.
func leanExchange(pool *connPool, upstream string, req *fasthttp.Request) (*upstreamConn, int, error) {
	for try := 0; ; try++ {
		u, pooled, err := pool.take(try, upstream)
		if err != nil {
			return nil, 0, err
		}
		u.out = req.Header.AppendBytes(u.out[:0])
		u.out = append(u.out, req.Body()...)
		k := 0
		err = armedWrite(u.rc, u.out, func(fd int) (bool, error) {
			n, err := syscall.Read(fd, u.buf)
			if n > 0 {
				u.acc = append(u.acc, u.buf[:n]...)
				k = messageLen(u.acc)
				return k > 0, nil
			}
			if err == nil {
				err = io.EOF
			}
			return false, err
		})
		if err == nil {
			return u, k, nil
		}
		u.c.Close()
		if !pooled || len(u.acc) > 0 {
			return nil, 0, err
		}
	}
}

// armedWrite writes out on the socket of rc with its read armed first, then waits until it is readable
// and calls read until it reports done: the bytes that answer out cannot come before it is written, so
// nothing is read to find the socket empty, and readiness announced after the arm is not lost.
func armedWrite(rc syscall.RawConn, out []byte, read func(fd int) (done bool, err error)) error {
	written := false
	var ioErr error
	err := rc.Read(func(fd uintptr) bool {
		if !written {
			for len(out) > 0 {
				n, err := syscall.Write(int(fd), out)
				if errors.Is(err, syscall.EINTR) {
					continue
				}
				if err != nil {
					ioErr = err
					return true
				}
				out = out[n:]
			}
			written = true
			return false // wait until readable
		}
		for {
			done, err := read(int(fd))
			switch {
			case errors.Is(err, syscall.EAGAIN):
				return false
			case errors.Is(err, syscall.EINTR):
				continue
			case err != nil:
				ioErr = err
				return true
			case done:
				return true
			}
		}
	})
	if err != nil {
		return err
	}
	return ioErr
}
