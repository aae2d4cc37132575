package telemetry

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

func TestParseCacheStatus(t *testing.T) {
	var p fastjson.Parser
	f := func(body string, wantOcc float64, wantAvail bool) {
		t.Helper()
		occ, avail, err := ParseCacheStatus(&p, []byte(body))
		if err != nil || occ != wantOcc || avail != wantAvail {
			t.Fatalf("ParseCacheStatus(%s) = %v, %v, %v; want %v, %v", body, occ, avail, err, wantOcc, wantAvail)
		}
	}
	f(`{"occupancy":0.5,"cache_available":true}`, 0.5, true)
	f(`{"cache_available":false,"occupancy":0}`, 0, false)
	f(`{"occupancy":1,"cache_available":true}`, 1, true)
	f(` {"occupancy": 2.5e-1, "cache_available": true, "instance_id": "vllm-001", "key_count": 12} `, 0.25, true)
	f(`{"occupancy":1E-3,"cache_available":false,"extra":{"nested":[1,2,3]}}`, 0.001, false)

	bad := func(body, want string) {
		t.Helper()
		_, _, err := ParseCacheStatus(&p, []byte(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("ParseCacheStatus(%s) error = %v; want one containing %q", body, err, want)
		}
	}
	bad(``, "cannot parse")
	bad(`{"occupancy":0.5,"cache_available":true`, "cannot parse")
	bad(`<html>Internal Server Error</html>`, "cannot parse")
	bad(`[0.5,true]`, "JSON object")
	bad(`null`, "JSON object")
	bad(`{"cache_available":true}`, `"occupancy"`)
	bad(`{"occupancy":"0.5","cache_available":true}`, `"occupancy"`)
	bad(`{"occupancy":null,"cache_available":true}`, `"occupancy"`)
	bad(`{"occupancy":1.5,"cache_available":true}`, "[0, 1]")
	bad(`{"occupancy":-0.1,"cache_available":true}`, "[0, 1]")
	bad(`{"occupancy":1e400,"cache_available":true}`, "[0, 1]")
	bad(`{"occupancy":0.5}`, `"cache_available"`)
	bad(`{"occupancy":0.5,"cache_available":"true"}`, `"cache_available"`)
	bad(`{"occupancy":0.5,"cache_available":1}`, `"cache_available"`)
}

func TestCacheStatus(t *testing.T) {
	var s CacheStatus
	f := func(now, maxAge int64, wantOcc float64, wantAvail, wantOK bool) {
		t.Helper()
		occ, avail, ok := s.Get(now, maxAge)
		if occ != wantOcc || avail != wantAvail || ok != wantOK {
			t.Fatalf("Get(%d, %d) = %v, %v, %v; want %v, %v, %v", now, maxAge, occ, avail, ok, wantOcc, wantAvail, wantOK)
		}
	}
	f(0, 0, 0, false, false)
	s.Store(0.75, true, 1000)
	f(1000, 10, 0.75, true, true)
	f(1009, 10, 0.75, true, true)
	f(1010, 10, 0, false, false)
	f(1<<62, 0, 0.75, true, true)
	s.Invalidate()
	f(1000, 10, 0, false, false)
	s.Store(0.1, false, 2000)
	f(2000, 10, 0.1, false, true)
}

func TestLMCacheConfigValidate(t *testing.T) {
	ok := func(c LMCacheConfig) {
		t.Helper()
		if err := c.Validate(); err != nil {
			t.Fatalf("Validate(%+v): %s", c, err)
		}
	}
	ok(LMCacheConfig{URL: "http://127.0.0.1:9000/status"})
	ok(LMCacheConfig{URL: "https://lmcache.internal/v1/status?instance_id=vllm-001", Refresh: time.Second})
	bad := func(c LMCacheConfig, want ...string) {
		t.Helper()
		err := c.Validate()
		if err == nil {
			t.Fatalf("Validate(%+v) = nil; want an error", c)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("Validate(%+v) = %q; want it to mention %q", c, err, w)
			}
		}
	}
	bad(LMCacheConfig{}, "scheme")
	bad(LMCacheConfig{URL: "tcp://h:9000"}, "scheme")
	bad(LMCacheConfig{URL: "http://h:9000/#frag"}, "fragment")
	bad(LMCacheConfig{URL: "http://h:1", Refresh: -1, Timeout: -2, MaxBodySize: -3}, "refresh -1ns", "timeout -2ns", "max body size -3")
}

func TestLMCachePoller(t *testing.T) {
	var body atomic.Pointer[string]
	var status atomic.Int64
	var hits atomic.Int64
	set := func(code int, b string) {
		status.Store(int64(code))
		body.Store(&b)
	}
	set(200, `{"occupancy":0.25,"cache_available":true}`)
	base := startServer(t, func(ctx *fasthttp.RequestCtx) {
		hits.Add(1)
		if string(ctx.Path()) != "/status" || string(ctx.QueryArgs().Peek("instance")) != "vllm-1" {
			ctx.SetStatusCode(404)
			return
		}
		ctx.SetStatusCode(int(status.Load()))
		ctx.SetContentType("application/json")
		ctx.SetBodyString(*body.Load())
	})

	var cs CacheStatus
	var deny atomic.Bool
	errDenied := errors.New("denied")
	lp := NewLMCachePoller(LMCacheConfig{
		URL:     base + "/status?instance=vllm-1",
		Timeout: 5 * time.Second,
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if deny.Load() {
				return nil, errDenied
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}, &cs, discardLogger)
	defer lp.Stop()

	now := func() int64 { return time.Now().UnixNano() }
	const maxAge = int64(time.Minute)
	expect := func(wantOcc float64, wantAvail, wantOK bool, wantFailed uint64) {
		t.Helper()
		lp.p.pollOnce()
		occ, avail, ok := cs.Get(now(), maxAge)
		if occ != wantOcc || avail != wantAvail || ok != wantOK {
			t.Fatalf("Get = %v, %v, %v; want %v, %v, %v (stats %+v)", occ, avail, ok, wantOcc, wantAvail, wantOK, lp.Stats())
		}
		if st := lp.Stats(); st.Failed != wantFailed {
			t.Fatalf("Stats = %+v; want %d failures", st, wantFailed)
		}
	}
	expect(0.25, true, true, 0)
	set(200, `{"occupancy":0.9,"cache_available":false}`)
	expect(0.9, false, true, 0)
	set(200, `{"occupancy":0.9,`)
	expect(0, false, false, 1) // invalid JSON
	set(200, `{"occupancy":0.5,"cache_available":true}`)
	expect(0.5, true, true, 1) // recovers
	set(200, `{"occupancy":1.01,"cache_available":true}`)
	expect(0, false, false, 2) // out of range
	set(200, `{"occupancy":0.5,"cache_available":true}`)
	expect(0.5, true, true, 2)
	set(500, `{"occupancy":0.5,"cache_available":true}`)
	expect(0, false, false, 3) // HTTP 500, even with a valid body
	set(200, `{"occupancy":0.4,"cache_available":true}`)
	expect(0.4, true, true, 3)
	deny.Store(true)
	h := hits.Load()
	expect(0, false, false, 4) // egress policy checked on every refresh
	if hits.Load() != h || !errors.Is(lp.Stats().LastError, errDenied) {
		t.Fatalf("a denied poll reached the server or lost its error: %+v", lp.Stats())
	}
	deny.Store(false)
	expect(0.4, true, true, 4)
	if _, _, ok := cs.Get(now()+maxAge, maxAge); ok {
		t.Fatalf("a poll older than maxAge is still ok")
	}
}

func TestLMCachePollerStartStop(t *testing.T) {
	var hits atomic.Int64
	base := startServer(t, func(ctx *fasthttp.RequestCtx) {
		hits.Add(1)
		ctx.SetBodyString(`{"occupancy":0.3,"cache_available":true}`)
	})
	var cs CacheStatus
	lp := NewLMCachePoller(LMCacheConfig{URL: base + "/", Refresh: 10 * time.Millisecond, Timeout: 5 * time.Second}, &cs, discardLogger)
	lp.Start()
	waitFor(t, "three polls", func() bool {
		_, _, ok := cs.Get(time.Now().UnixNano(), int64(time.Minute))
		return ok && lp.Stats().OK >= 3
	})
	lp.Stop()
	h := hits.Load()
	time.Sleep(50 * time.Millisecond)
	if hits.Load() != h {
		t.Fatalf("polls continued after Stop")
	}
}
