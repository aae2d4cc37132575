package sim

import (
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A prefill sim and a decode sim driven the way SGLang's routers drive SGLang engines
// (python/sglang/srt/disaggregation/mini_lb.py): the client's body plus bootstrap_host,
// bootstrap_port and bootstrap_room, sent to both engines at once.

var roomSeq atomic.Uint64

func newRoom() uint64 { return 1<<62 + roomSeq.Add(1) }

// roomBody is req with the three members SGLang's routers add, naming p as the prefill engine.
func roomBody(req map[string]any, p *Engine, room uint64) string {
	b := make(map[string]any, len(req)+3)
	for k, v := range req {
		b[k] = v
	}
	b["bootstrap_host"] = "127.0.0.1"
	b["bootstrap_port"] = p.sideChannelPort()
	b["bootstrap_room"] = room
	out, _ := json.Marshal(b)
	return string(out)
}

type answer struct {
	status int
	body   []byte
	err    error
}

// goPost posts body in the background; the answer arrives on the channel.
func goPost(c *client, url, body string) chan answer {
	ch := make(chan answer, 1)
	go func() {
		status, _, b, err := c.post(url, body)
		ch <- answer{status, b, err}
	}()
	return ch
}

// usageOf returns the usage of a JSON answer, or of the last event of an SSE answer.
func usageOf(t *testing.T, a answer, stream bool) (*usage, string) {
	t.Helper()
	if a.err != nil || a.status != 200 {
		t.Fatalf("answer %d %s %v", a.status, a.body, a.err)
	}
	b := a.body
	if stream {
		events, done := sseEvents(string(b))
		if !done || len(events) == 0 {
			t.Fatalf("stream without [DONE]: %s", b)
		}
		b = []byte(events[len(events)-1])
	}
	var out completion
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("cannot decode %s: %s", b, err)
	}
	if out.Usage == nil {
		t.Fatalf("no usage in %s", b)
	}
	reason := ""
	if len(out.Choices) > 0 {
		reason = out.Choices[0].FinishReason
	}
	return out.Usage, reason
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(body string) (events []string, done bool) {
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			done = true
		default:
			events = append(events, data)
		}
	}
	return events, done
}

type sglangError struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    int    `json:"code"`
}

// wantSGLangError checks that b is SGLang's ErrorResponse with status and a message holding want.
func wantSGLangError(t *testing.T, b []byte, status int, want string) {
	t.Helper()
	var e sglangError
	if err := json.Unmarshal(b, &e); err != nil || e.Object != "error" || e.Code != status || !strings.Contains(e.Message, want) {
		t.Fatalf("want SGLang's error %d with %q, got %s", status, want, b)
	}
}

func TestSGLangRoom(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	bs := p.Config().BlockSize
	n := 0
	f := func(path string, stream bool) {
		t.Helper()
		n++
		text := words("room"+strconv.Itoa(n), 60)
		req := map[string]any{"model": "sim-model", "max_tokens": 5}
		if path == "/v1/chat/completions" {
			req["messages"] = []map[string]string{{"role": "user", "content": text}}
		} else {
			req["prompt"] = text
		}
		if stream {
			req["stream"] = true
			req["stream_options"] = map[string]any{"include_usage": true}
		}
		tokens := promptTokens(t, c, p.URL(), req)
		full := tokens / bs
		for round := range 2 {
			before, dBefore := p.Stats(), d.Stats()
			body := roomBody(req, p, newRoom())
			pch, dch := goPost(c, p.URL()+path, body), goPost(c, d.URL()+path, body)
			pu, pReason := usageOf(t, <-pch, stream)
			du, _ := usageOf(t, <-dch, stream)
			// SGLang's prefill generates one token, whatever max_tokens says.
			if pu.CompletionTokens != 1 || pu.PromptTokens != tokens || (!stream && pReason != "length") {
				t.Fatalf("%s stream=%v round %d: prefill usage %+v finish %q", path, stream, round, pu, pReason)
			}
			wantCached := 0
			if round == 1 {
				wantCached = min(full, (tokens-1)/bs) * bs // the prefill's cache is warm now
			}
			if pu.PromptTokensDetails.CachedTokens != wantCached {
				t.Fatalf("%s stream=%v round %d: prefill cached_tokens %d, want %d", path, stream, round, pu.PromptTokensDetails.CachedTokens, wantCached)
			}
			// The decode reports the prefill's cached_tokens, as SGLang's does.
			if du.PromptTokens != tokens || du.CompletionTokens != 5 || du.PromptTokensDetails.CachedTokens != wantCached {
				t.Fatalf("%s stream=%v round %d: decode usage %+v, want cached_tokens %d", path, stream, round, du, wantCached)
			}
			ps, ds := p.Stats(), d.Stats()
			moved := full // the first round reads every block; the second only what the decode lacks
			if round == 1 {
				moved = full - min(full, (tokens-1)/bs)
			}
			if ps.RoomsServed != before.RoomsServed+1 || ps.BlocksSent != before.BlocksSent+uint64(moved) ||
				ds.BlocksReceived != dBefore.BlocksReceived+uint64(moved) || ds.RoomDecodes != dBefore.RoomDecodes+1 || ds.RoomsFailed != 0 {
				t.Fatalf("%s stream=%v round %d: moved %d blocks? prefill %+v decode %+v", path, stream, round, moved, ps, ds)
			}
			if ds.CachedBlocks < full {
				t.Fatalf("%s: the decode cached %d blocks, want >= %d", path, ds.CachedBlocks, full)
			}
			eventually(t, "the prefill sim to free the room", func() bool { s := p.Stats(); return s.HeldBlocks == 0 && s.UsedBlocks == 0 })
		}
	}
	f("/v1/completions", false)
	f("/v1/chat/completions", false)
	f("/v1/completions", true)
	f("/v1/chat/completions", true)

	if m := c.metrics(p.URL()); m["rolter_sim_bootstrap_rooms_served_total"] != 8 || m["sglang:num_bootstrap_failed_reqs_total"] != 0 {
		t.Fatalf("prefill metrics %v", m)
	}
}

func TestSGLangDecodeFirst(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	req := map[string]any{"model": "sim-model", "prompt": words("decode-first", 60), "max_tokens": 3}
	body := roomBody(req, p, newRoom())
	dch := goPost(c, d.URL()+"/v1/completions", body)
	eventually(t, "the decode to wait for its room", func() bool { return d.Stats().RoomDecodes == 1 })
	time.Sleep(2 * roomPoll) // let it ask the prefill engine, and wait, more than once
	select {
	case a := <-dch:
		t.Fatalf("the decode answered before the prefill came: %d %s", a.status, a.body)
	default:
	}
	pu, _ := usageOf(t, <-goPost(c, p.URL()+"/v1/completions", body), false)
	du, _ := usageOf(t, <-dch, false)
	if pu.CompletionTokens != 1 || du.CompletionTokens != 3 || du.PromptTokens != pu.PromptTokens {
		t.Fatalf("prefill %+v decode %+v", pu, du)
	}
	if s := p.Stats(); s.RoomsServed != 1 || s.BlocksSent == 0 {
		t.Fatalf("prefill stats %+v", s)
	}
}

func TestSGLangTimeouts(t *testing.T) {
	pc := pdConfig(RolePrefill)
	pc.BootstrapTimeout = 200 * time.Millisecond
	p := startEngine(t, pc)
	dc := pdConfig(RoleDecode)
	dc.WaitingTimeout = 300 * time.Millisecond
	d := startEngine(t, dc)
	c := newClient(t, 10*time.Second)
	req := map[string]any{"model": "sim-model", "prompt": words("never", 60), "max_tokens": 3}

	// The prefill request never comes: the decode fails after its waiting timeout.
	a := <-goPost(c, d.URL()+"/v1/completions", roomBody(req, p, newRoom()))
	if a.status != 500 {
		t.Fatalf("decode without a prefill: %d %s", a.status, a.body)
	}
	wantSGLangError(t, a.body, 500, "in KVPoll.WaitingForInput")
	// In a stream: the headers went out, so one error event, then [DONE].
	sreq := map[string]any{"model": "sim-model", "prompt": req["prompt"], "max_tokens": 3, "stream": true}
	a = <-goPost(c, d.URL()+"/v1/completions", roomBody(sreq, p, newRoom()))
	events, done := sseEvents(string(a.body))
	if a.status != 200 || !done || len(events) != 1 {
		t.Fatalf("stream without a prefill: %d %s", a.status, a.body)
	}
	wantSGLangError(t, []byte(events[0]), 500, "timed out")

	// The decode request never comes: the prefill frees the room after its bootstrap timeout.
	a = <-goPost(c, p.URL()+"/v1/completions", roomBody(req, p, newRoom()))
	if a.status != 500 {
		t.Fatalf("prefill without a decode: %d %s", a.status, a.body)
	}
	wantSGLangError(t, a.body, 500, "in KVPoll.Bootstrapping")
	if s := p.Stats(); s.RoomsExpired != 1 || s.HeldBlocks != 0 || s.UsedBlocks != 0 {
		t.Fatalf("prefill stats %+v", s)
	}

	// A prefill engine that is not there.
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := strings.Replace(roomBody(req, p, newRoom()), strconv.Itoa(p.sideChannelPort()), strconv.Itoa(closed.Addr().(*net.TCPAddr).Port), 1)
	_ = closed.Close()
	a = <-goPost(c, d.URL()+"/v1/completions", gone)
	wantSGLangError(t, a.body, 500, "it might be dead")

	if s := d.Stats(); s.RoomsFailed != 3 || s.UsedBlocks != 0 {
		t.Fatalf("decode stats %+v", s)
	}
	if m := c.metrics(d.URL()); m["sglang:num_transfer_failed_reqs_total"] != 3 {
		t.Fatalf("decode metrics %v", m)
	}
	if m := c.metrics(p.URL()); m["sglang:num_bootstrap_failed_reqs_total"] != 1 {
		t.Fatalf("prefill metrics %v", m)
	}
}

// rawPost sends body on a connection of its own and returns it without reading the answer.
func rawPost(t *testing.T, addr, path, body string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func TestSGLangClientLeaves(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	req := map[string]any{"model": "sim-model", "prompt": words("leaves", 60), "max_tokens": 3}

	// The decode's client leaves while it waits: the decode tells the prefill engine, and the
	// prefill request that comes later fails at once and keeps nothing.
	body := roomBody(req, p, newRoom())
	conn := rawPost(t, d.Addr(), "/v1/completions", body)
	eventually(t, "the decode to wait for its room", func() bool { return d.Stats().RoomDecodes == 1 })
	_ = conn.Close()
	eventually(t, "the decode to give the room up", func() bool { return p.Stats().RoomsAborted == 1 && d.Stats().Disconnects == 1 })
	a := <-goPost(c, p.URL()+"/v1/completions", body)
	if a.status != 500 {
		t.Fatalf("prefill after its decode left: %d %s", a.status, a.body)
	}
	wantSGLangError(t, a.body, 500, "aborted")
	if s := p.Stats(); s.HeldBlocks != 0 || s.UsedBlocks != 0 || s.RoomsServed != 0 {
		t.Fatalf("prefill stats %+v", s)
	}

	// The prefill's client leaves while its blocks wait for a decode: they are freed.
	conn = rawPost(t, p.Addr(), "/v1/completions", roomBody(req, p, newRoom()))
	eventually(t, "the prefill to hold the room", func() bool { return p.Stats().HeldBlocks > 0 })
	_ = conn.Close()
	eventually(t, "the prefill to free the room", func() bool {
		s := p.Stats()
		return s.HeldBlocks == 0 && s.UsedBlocks == 0 && s.RoomsAborted == 2
	})
	p.mu.Lock()
	left := len(p.rooms)
	p.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d rooms left on the prefill sim", left)
	}
}

func TestSGLangHostileInput(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	b := startEngine(t, pdConfig(RoleBoth))
	c := newClient(t, 10*time.Second)
	f := func(e *Engine, fields, want string) {
		t.Helper()
		status, _, body, err := c.post(e.URL()+"/v1/completions", `{"model":"sim-model","prompt":"hello there",`+fields+`}`)
		if err != nil || status != 400 {
			t.Fatalf("%s: want a 400, got %d %s %v", fields, status, body, err)
		}
		wantSGLangError(t, body, 400, want)
	}
	for _, e := range []*Engine{p, d} {
		f(e, `"bootstrap_room":null`, "without bootstrap room id")
		f(e, `"bootstrap_room":"7"`, "valid integer")
		f(e, `"bootstrap_room":1.5`, "valid integer")
		f(e, `"bootstrap_room":1e3`, "valid integer")
		f(e, `"bootstrap_room":true`, "valid integer")
		f(e, `"bootstrap_room":[1,2]`, "batched /generate")
		f(e, `"bootstrap_room":1,"bootstrap_host":5`, "bootstrap_host")
		f(e, `"bootstrap_room":1,"bootstrap_host":["a"]`, "bootstrap_host")
		f(e, `"bootstrap_room":1,"bootstrap_host":"a\nb"`, "bootstrap_host")
		f(e, `"bootstrap_room":1,"bootstrap_port":"8998"`, "bootstrap_port")
		f(e, `"bootstrap_room":1,"bootstrap_port":1.5`, "bootstrap_port")
		f(e, `"bootstrap_room":1,"bootstrap_port":70000`, "bootstrap_port")
	}
	f(b, `"bootstrap_room":1`, "--role prefill or decode")
	if s := p.Stats(); s.HeldBlocks != 0 || s.UsedBlocks != 0 {
		t.Fatalf("refused requests hold blocks: %+v", s)
	}
	// An aggregated engine ignores the members, as SGLang without --disaggregation-mode does.
	a := startEngine(t, testConfig())
	if status, out := c.completion(a.URL()+"/v1/completions", `{"prompt":"hello there","bootstrap_room":"x","bootstrap_port":[]}`); status != 200 || out.Usage == nil {
		t.Fatalf("aggregated engine: %d %+v", status, out)
	}

	// The bootstrap endpoints refuse garbage.
	side := "http://" + p.SideChannelAddr()
	g := func(path, body string, want int) {
		t.Helper()
		status, _, b, err := c.post(side+path, body)
		if err != nil || status != want || !strings.Contains(string(b), `"error"`) {
			t.Fatalf("%s %q: %d %s %v", path, body, status, b, err)
		}
	}
	g("/room", "{not json", 400)
	g("/room", `{"room":"1","start":0,"wait_ms":0}`, 400)
	g("/room", `{"room":1,"start":-1,"wait_ms":0}`, 400)
	g("/room", `{"room":1,"start":0,"wait_ms":0}`, 404)
	g("/room/abort", `[]`, 400)
	g("/room/abort", `{"room":1.5}`, 400)
	g("/rooms", `{}`, 404)
}

func TestSGLangRoomsDoNotMix(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	reqA := map[string]any{"model": "sim-model", "prompt": words("mix-a", 40), "max_tokens": 2}
	reqB := map[string]any{"model": "sim-model", "prompt": words("mix-b", 90), "max_tokens": 4}
	ta, tb := promptTokens(t, c, p.URL(), reqA), promptTokens(t, c, p.URL(), reqB)
	roomA, roomB := newRoom(), newRoom()
	// All four at once, decodes first.
	da := goPost(c, d.URL()+"/v1/completions", roomBody(reqA, p, roomA))
	db := goPost(c, d.URL()+"/v1/completions", roomBody(reqB, p, roomB))
	pb := goPost(c, p.URL()+"/v1/completions", roomBody(reqB, p, roomB))
	pa := goPost(c, p.URL()+"/v1/completions", roomBody(reqA, p, roomA))
	for _, x := range []struct {
		ch     chan answer
		tokens int
		out    int
	}{{da, ta, 2}, {db, tb, 4}, {pa, ta, 1}, {pb, tb, 1}} {
		u, _ := usageOf(t, <-x.ch, false)
		if u.PromptTokens != x.tokens || u.CompletionTokens != x.out {
			t.Fatalf("usage %+v, want %d prompt and %d completion tokens", u, x.tokens, x.out)
		}
	}
	if s := p.Stats(); s.RoomsServed != 2 {
		t.Fatalf("prefill stats %+v", s)
	}
	// A decode whose body is not the prefill's gets blocks of another prompt: it fails.
	room := newRoom()
	pch := goPost(c, p.URL()+"/v1/completions", roomBody(reqA, p, room))
	a := <-goPost(c, d.URL()+"/v1/completions", roomBody(map[string]any{"model": "sim-model", "prompt": words("mix-c", 40), "max_tokens": 2}, p, room))
	wantSGLangError(t, a.body, 500, "other tokens")
	<-pch
	if s := d.Stats(); s.RoomsFailed != 1 {
		t.Fatalf("decode stats %+v", s)
	}
}

// TestStopSGLangLeavesNoGoroutines: a room held at Stop is freed, its timer stopped, its waiting
// prefill request answered.
func TestStopSGLangLeavesNoGoroutines(t *testing.T) {
	p, err := New(pdConfig(RolePrefill))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	req := map[string]any{"model": "sim-model", "prompt": words("stop-room", 60), "max_tokens": 2}
	conn := rawPost(t, p.Addr(), "/v1/completions", roomBody(req, p, newRoom()))
	defer conn.Close()
	eventually(t, "the prefill to hold the room", func() bool { return p.Stats().HeldBlocks > 0 })
	p.Stop()
	if s := p.Stats(); s.HeldBlocks != 0 || s.UsedBlocks != 0 {
		t.Fatalf("after Stop the prefill sim holds blocks: %+v", s)
	}
	dl := time.Now().Add(3 * time.Second)
	for engineGoroutines() != "" && time.Now().Before(dl) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := engineGoroutines(); g != "" {
		t.Fatalf("goroutines left after Stop:\n%s", g)
	}
}
