// Command fakeupstream is the zero-delay OpenAI-compatible upstream of the overhead report
// (fleet.NewFakeUpstream): instant JSON answers, and paced SSE answers (a role chunk, 64 deltas
// 20ms apart, [DONE]) for "stream": true. It prints "listening http://ADDR" once it listens and
// exits on SIGINT/SIGTERM or when its stdin closes (its parent is gone).
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	chunks := flag.Int("chunks", 64, "content deltas per streamed answer")
	gap := flag.Duration("gap", 20*time.Millisecond, "time between two deltas")
	watchStdin := flag.Bool("watch-stdin", true, "exit when stdin reaches EOF")
	flag.Parse()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fakeupstream: cannot listen on %q: %s\n", *listen, err)
		os.Exit(1)
	}
	srv := &fasthttp.Server{
		Handler:               fleet.NewFakeUpstream(fleet.UpstreamConfig{Chunks: *chunks, Gap: *gap}),
		Name:                  "fakeupstream",
		NoDefaultDate:         true,
		ReadTimeout:           time.Minute,
		IdleTimeout:           time.Minute,
		CloseOnShutdown:       true,
		MaxIdleWorkerDuration: time.Second,
	}
	fmt.Printf("listening http://%s\n", ln.Addr())

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	if *watchStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop <- syscall.SIGTERM
		}()
	}
	go func() {
		<-stop
		_ = srv.Shutdown()
	}()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintf(os.Stderr, "fakeupstream: %s\n", err)
		os.Exit(1)
	}
}
