package engine

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Dynamic loading (dynamic_lora): before a request of an adapter goes to a replica that does not list the
// adapter in /v1/models, the gateway loads it there with vLLM's POST /v1/load_lora_adapter {"lora_name",
// "lora_path"} - an API no client can reach through the gateway (handler.go). One load per (adapter,
// replica) runs at a time: the requests that need it meanwhile wait for that one. vLLM's "has already been
// loaded" answer is a success.

// loader is one (adapter, replica)'s dynamic loads.
type loader struct {
	// done says the replica has the adapter: this gateway loaded it, or the replica said it had it.
	done atomic.Bool
	at   atomic.Int64 // unix nanoseconds when done was last set
	mu   sync.Mutex
	cur  *loadFlight // the load in flight, or nil
	// Loads that succeeded and failed.
	loads, failures atomic.Uint64
}

// loadFlight is one load: its waiters read err once ready is closed.
type loadFlight struct {
	ready chan struct{}
	err   error
}

// ensure makes sure target i has the adapter before a request goes there: at once when it does, else by
// loading it or waiting for the load in flight, at most lr.timeout.
func (lr *loraRoute) ensure(t *Target, i int) error {
	ld := &lr.targets[i].load
	now := time.Now().UnixNano()
	if a := t.Provider.adapters; a != nil {
		if known, listed, at := a.listed(lr.adapter, now); known {
			if listed {
				return nil
			}
			if at > ld.at.Load() {
				// A list read after the last load does not have it: it was unloaded, or the replica restarted.
				ld.done.Store(false)
			}
		}
	}
	if ld.done.Load() {
		return nil
	}
	ld.mu.Lock()
	if ld.done.Load() {
		ld.mu.Unlock()
		return nil
	}
	f := ld.cur
	if f == nil {
		f = &loadFlight{ready: make(chan struct{})}
		ld.cur = f
		ld.mu.Unlock()
		f.err = lr.load(t)
		ld.mu.Lock()
		if f.err == nil {
			ld.at.Store(time.Now().UnixNano())
			ld.done.Store(true)
			ld.loads.Add(1)
		} else {
			ld.failures.Add(1)
		}
		ld.cur = nil
		ld.mu.Unlock()
		close(f.ready)
		return f.err
	}
	ld.mu.Unlock()
	timer := time.NewTimer(lr.timeout)
	defer timer.Stop()
	select {
	case <-f.ready:
		return f.err
	case <-timer.C:
		return fmt.Errorf("adapter %s is still loading on %s after %v", lr.adapter, t.Provider.Name, lr.timeout)
	}
}

// errAlreadyLoaded is the text of vLLM's answer to a load of an adapter it has.
var errAlreadyLoaded = []byte("has already been loaded")

// load sends one /v1/load_lora_adapter to t's engine.
func (lr *loraRoute) load(t *Target) error {
	p := t.Provider
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	u, _ := url.Parse(p.cfg.APIBase)
	req.SetRequestURI(u.Scheme + "://" + u.Host + "/v1/load_lora_adapter")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if p.auth != nil {
		req.Header.SetBytesV("Authorization", p.auth)
	}
	body := append([]byte(`{"lora_name":`), appendJSONString(nil, lr.adapter)...)
	body = append(body, `,"lora_path":`...)
	body = append(appendJSONString(body, lr.path), '}')
	req.SetBodyRaw(body)
	if err := p.admin.DoTimeout(req, resp, lr.timeout); err != nil {
		return fmt.Errorf("cannot load adapter %s on %s: %w", lr.adapter, p.Name, err)
	}
	switch st := resp.StatusCode(); {
	case st == fasthttp.StatusOK:
		return nil
	case st == fasthttp.StatusBadRequest && bytes.Contains(resp.Body(), errAlreadyLoaded):
		return nil
	default:
		msg := resp.Body()
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return errors.New("cannot load adapter " + lr.adapter + " on " + p.Name + ": HTTP " + fmt.Sprint(st) + ": " + string(bytes.ToValidUTF8(msg, nil)))
	}
}

// newAdminClient returns the client of p's engine administration API (a few connections: loads of several
// adapters may run at once), dialled like the proxy's connections: the same engine, the same egress policy.
func newAdminClient(p *Provider, env *buildEnv) *fasthttp.HostClient {
	u, _ := url.Parse(p.cfg.APIBase)
	c := &fasthttp.HostClient{
		Addr:                      p.up.addr,
		IsTLS:                     u.Scheme == "https",
		TLSConfig:                 p.up.tlsConfig,
		MaxConns:                  4,
		MaxConnWaitTimeout:        time.Minute,
		NoDefaultUserAgentHeader:  true,
		DisablePathNormalizing:    true,
		MaxIdleConnDuration:       p.up.maxIdleAge,
		MaxIdemponentCallAttempts: 1,
	}
	c.DialTimeout = (fasthttp.DialFuncWithTimeout)(env.dial)
	if env.dial == nil {
		c.DialTimeout = env.egress[useProxy].Dial
	}
	return c
}
