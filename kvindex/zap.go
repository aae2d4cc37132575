//go:build cgo

package kvindex

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// zapEndpoint is where libzmq looks for the ZAP handler of a context (ZMQ RFC 27): every socket of the
// context with a ZAP domain, or with CURVE, sends its handshakes' requests there.
const zapEndpoint = "inproc://zeromq.zap.01"

// zapHandler is the Subscriber's ZAP handler: one goroutine that owns a REP socket bound to zapEndpoint in
// the Subscriber's own context and answers with authorizer.answer. pebbe/zmq4's AuthStart is not used: it
// is process-global, bound to the default context, and panics on a request it does not expect.
//
// libzmq 4.3 fails open when no handler is bound: a NULL socket with a domain, or a CURVE socket, then
// admits every peer (ZMQ_ZAP_ENFORCE_DOMAIN would refuse them, but it is a draft option pebbe/zmq4 does
// not expose). So the handler is bound before the first socket with a policy binds (Subscriber.launch
// starts it and waits), a socket with a policy is never bound if the handler failed to start, and the
// handler's socket stays bound until every worker has ended (Subscriber.Stop stops it last).
type zapHandler struct {
	auth *authorizer
	zctx *zmq.Context
	log  *slog.Logger

	// Guarded by Subscriber.mu.
	started bool
	err     error // why the handler could not start; set once, before any worker that needs it starts
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// start starts the handler goroutine and waits until its socket is bound or failed to bind. ctx is not the
// workers' context: the handler must outlive them.
func (h *zapHandler) start() error {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	ready := make(chan error, 1)
	h.wg.Add(1)
	go h.run(ctx, ready)
	if err := <-ready; err != nil {
		cancel()
		h.wg.Wait()
		return err
	}
	return nil
}

// cancelRun tells the handler goroutine to end; it notices within recvTimeout, or at once when the
// context is terminated (Subscriber.Stop). A handler never started is a no-op.
func (h *zapHandler) cancelRun() {
	if h.cancel != nil {
		h.cancel()
	}
}

// wait waits for the handler goroutine to end.
func (h *zapHandler) wait() {
	h.wg.Wait()
}

func (h *zapHandler) run(ctx context.Context, ready chan<- error) {
	defer h.wg.Done()
	sock, err := h.zctx.NewSocket(zmq.REP)
	if err != nil {
		ready <- fmt.Errorf("cannot create ZAP socket: %w", err)
		return
	}
	defer sock.Close()
	for _, err := range []error{sock.SetLinger(0), sock.SetRcvtimeo(recvTimeout), sock.Bind(zapEndpoint)} {
		if err != nil {
			ready <- fmt.Errorf("cannot bind ZAP handler to %q: %w", zapEndpoint, err)
			return
		}
	}
	ready <- nil
	for ctx.Err() == nil {
		if err := h.serve(sock); err != nil {
			switch zmq.AsErrno(err) {
			case zmq.Errno(syscall.EAGAIN), zmq.Errno(syscall.EINTR):
				continue
			case zmq.ETERM:
				return
			}
			// The socket stays bound whatever happens: closing it would let every connection in (see
			// zapHandler). A send that failed or a panic between receive and send leaves the REP socket
			// expecting a reply (EFSM on the next receive): answer with an empty request id, which
			// libzmq takes as a malformed reply and refuses the handshake.
			h.log.Error("ZAP handler failed; refusing the request", "err", err)
			if zmq.AsErrno(err) == zmq.EFSM {
				_ = sendFrames(sock, [][]byte{[]byte(zapVersion), nil, []byte(zapInternal), []byte("internal error"), nil, nil})
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// serve answers one request.
func (h *zapHandler) serve(sock *zmq.Socket) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	// libzmq's requests are a few hundred bytes at most, and only sockets of this context reach an
	// inproc endpoint.
	frames, err := sock.RecvMessageBytes(0)
	if err != nil {
		return err
	}
	reply := h.auth.answer(frames, time.Now())
	return sendFrames(sock, reply[:])
}

// sendFrames sends one multipart message.
func sendFrames(sock *zmq.Socket, frames [][]byte) error {
	if len(frames) == 0 {
		return errors.New("BUG: empty message")
	}
	for i, f := range frames {
		flag := zmq.SNDMORE
		if i == len(frames)-1 {
			flag = 0
		}
		if _, err := sock.SendBytes(f, flag); err != nil {
			return err
		}
	}
	return nil
}
