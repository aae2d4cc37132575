package sim

import (
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// A prefill sim and a decode sim, driven the way vLLM's toy proxy
// (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py) drives two vLLM engines with
// the NixlConnector: the request with kv_transfer_params {do_remote_decode: true, ...null},
// stream false and max_tokens 1 to the prefill engine, then the original request plus the
// kv_transfer_params the prefill engine answered to the decode engine.

func pdConfig(role Role) Config {
	c := testConfig()
	c.Role = role
	c.EngineID = "engine-" + string(role)
	c.NumBlocks = 256
	return c
}

// kvOffer is the kv_transfer_params of a prefill engine's answer.
type kvOffer struct {
	DoRemotePrefill bool     `json:"do_remote_prefill"`
	DoRemoteDecode  bool     `json:"do_remote_decode"`
	RemoteBlockIDs  []uint32 `json:"remote_block_ids"`
	RemoteEngineID  string   `json:"remote_engine_id"`
	RemoteRequestID string   `json:"remote_request_id"`
	RemoteHost      string   `json:"remote_host"`
	RemotePort      int      `json:"remote_port"`
	TPSize          int      `json:"tp_size"`
}

type prefillAnswer struct {
	completion
	KVTransferParams *kvOffer `json:"kv_transfer_params"`
}

// prefillHop sends what the toy proxy sends the prefill engine and returns its answer, raw and
// decoded.
func prefillHop(t *testing.T, c *client, base, path string, req map[string]any) (json.RawMessage, prefillAnswer) {
	t.Helper()
	p := make(map[string]any, len(req)+1)
	for k, v := range req {
		p[k] = v
	}
	p["kv_transfer_params"] = map[string]any{
		"do_remote_decode": true, "do_remote_prefill": false,
		"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil,
	}
	p["stream"] = false
	p["max_tokens"] = 1
	if _, ok := p["max_completion_tokens"]; ok {
		p["max_completion_tokens"] = 1
	}
	delete(p, "stream_options")
	delete(p, "min_tokens")
	delete(p, "min_completion_tokens")
	body, _ := json.Marshal(p)
	status, _, b, err := c.post(base+path, string(body), "X-Request-Id", "pd-req")
	if err != nil || status != 200 {
		t.Fatalf("prefill hop: %d %s %v", status, b, err)
	}
	var out prefillAnswer
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("cannot decode prefill answer %s: %s", b, err)
	}
	var raw struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	_ = json.Unmarshal(b, &raw)
	return raw.KV, out
}

// decodeBody is the toy proxy's second hop: the original request, min_tokens and
// min_completion_tokens put back (null when absent), and the prefill engine's kv_transfer_params.
func decodeBody(req map[string]any, kv json.RawMessage) string {
	d := make(map[string]any, len(req)+3)
	for k, v := range req {
		d[k] = v
	}
	if len(kv) > 0 && string(kv) != "null" {
		d["kv_transfer_params"] = kv
	}
	b, _ := json.Marshal(d)
	return string(b)
}

func promptTokens(t *testing.T, c *client, base string, req map[string]any) int {
	t.Helper()
	tr := map[string]any{"model": req["model"]}
	if m, ok := req["messages"]; ok {
		tr["messages"] = m
	} else {
		tr["prompt"] = req["prompt"]
	}
	body, _ := json.Marshal(tr)
	status, _, b, err := c.post(base+"/tokenize", string(body))
	if err != nil || status != 200 {
		t.Fatalf("tokenize: %d %s %v", status, b, err)
	}
	var out struct{ Count int }
	_ = json.Unmarshal(b, &out)
	return out.Count
}

func TestDisaggTwoHops(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	bs := p.Config().BlockSize
	n := 0
	f := func(path string, stream bool) {
		t.Helper()
		n++
		text := words("case"+strconv.Itoa(n), 60) // a new prompt each case: no local hit on the decode sim
		req := map[string]any{"model": "sim-model", "max_tokens": 5, "min_tokens": 2}
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
		before, dBefore := p.Stats(), d.Stats()

		raw, pa := prefillHop(t, c, p.URL(), path, req)
		kv := pa.KVTransferParams
		if kv == nil || !kv.DoRemotePrefill || kv.DoRemoteDecode || kv.RemoteEngineID != "engine-prefill" ||
			kv.RemoteHost != "127.0.0.1" || kv.RemotePort != p.sideChannelPort() || kv.TPSize != 1 ||
			len(kv.RemoteBlockIDs) != full || kv.RemoteRequestID == "" {
			t.Fatalf("%s: kv_transfer_params %s (prompt %d tokens)", path, raw, tokens)
		}
		if u := pa.Usage; u == nil || u.CompletionTokens != 1 || u.PromptTokens != tokens || pa.Choices[0].FinishReason != "length" {
			t.Fatalf("%s: prefill usage %+v", path, pa.Usage)
		}
		if s := p.Stats(); s.HeldBlocks < full || s.RemotePrefills != before.RemotePrefills+1 {
			t.Fatalf("%s: prefill holds %d blocks (want >= %d), %d remote prefills", path, s.HeldBlocks, full, s.RemotePrefills)
		}

		wantCached := min(full*bs, tokens-1)
		var u *usage
		if stream {
			status, s := c.stream(d.URL()+path, decodeBody(req, raw))
			if status != 200 || !s.done || len(s.events) == 0 {
				t.Fatalf("%s stream: %d %+v", path, status, s)
			}
			var last completion
			_ = json.Unmarshal([]byte(s.events[len(s.events)-1]), &last)
			u = last.Usage
		} else {
			status, out := c.completion(d.URL()+path, decodeBody(req, raw))
			if status != 200 || out.Choices[0].FinishReason != "length" {
				t.Fatalf("%s: decode %d %+v", path, status, out)
			}
			u = out.Usage
		}
		if u == nil || u.PromptTokens != tokens || u.CompletionTokens != 5 || u.PromptTokensDetails.CachedTokens != wantCached {
			t.Fatalf("%s stream=%v: decode usage %+v, want cached_tokens %d", path, stream, u, wantCached)
		}
		ds := d.Stats()
		if ds.BlocksReceived != dBefore.BlocksReceived+uint64(full) || ds.CachedBlocks < full || ds.PullsFailed != 0 {
			t.Fatalf("%s: decode stats %+v", path, ds)
		}
		eventually(t, "the prefill sim to free the pulled blocks", func() bool {
			s := p.Stats()
			return s.HeldBlocks == 0 && s.UsedBlocks == 0 && s.PullsServed == before.PullsServed+1
		})
	}
	f("/v1/completions", false)
	f("/v1/chat/completions", false)
	f("/v1/completions", true)
	f("/v1/chat/completions", true)

	// The decode sim's metrics count the read tokens as external hits, not local ones.
	m := c.metrics(d.URL())
	if m["vllm:external_prefix_cache_hits_total"] == 0 || m["vllm:prefix_cache_hits_total"] != 0 || m["vllm:nixl_num_failed_transfers_total"] != 0 ||
		m["vllm:nixl_xfer_time_seconds_count"] != 4 || m["vllm:nixl_xfer_time_seconds_bucket"] != 4 {
		t.Fatalf("decode metrics %v", m)
	}
}

func TestTransferHistogramText(t *testing.T) {
	var h histogram
	h.observe(0.003)
	h.observe(0.02)
	h.observe(7)
	got := string(h.append(nil, "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for NIXL KV Cache transfers.", "0", "m", 1.5))
	want := `# HELP vllm:nixl_xfer_time_seconds Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="m"} 1.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.01",model_name="m"} 1.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.025",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.05",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.075",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.1",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.2",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.5",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.75",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="5.0",model_name="m"} 2.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 3.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 7.023
# HELP vllm:nixl_xfer_time_seconds_created Histogram of transfer duration for NIXL KV Cache transfers.
# TYPE vllm:nixl_xfer_time_seconds_created gauge
vllm:nixl_xfer_time_seconds_created{engine="0",model_name="m"} 1.5
`
	if got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// prefillOnce runs the prefill hop of a completions request and returns the request and the
// kv_transfer_params to send the decode engine.
func prefillOnce(t *testing.T, c *client, p *Engine, seed string) (map[string]any, json.RawMessage) {
	t.Helper()
	req := map[string]any{"model": "sim-model", "prompt": words(seed, 60), "max_tokens": 3}
	raw, pa := prefillHop(t, c, p.URL(), "/v1/completions", req)
	if pa.KVTransferParams == nil || len(pa.KVTransferParams.RemoteBlockIDs) == 0 {
		t.Fatalf("no blocks offered: %s", raw)
	}
	return req, raw
}

func TestDisaggPullFailures(t *testing.T) {
	pc := pdConfig(RolePrefill)
	pc.KVLease = 50 * time.Millisecond
	p := startEngine(t, pc)
	short := p
	d := startEngine(t, pdConfig(RoleDecode))
	rc := pdConfig(RoleDecode)
	rc.KVLoadFailure = LoadRecompute
	dr := startEngine(t, rc)
	c := newClient(t, 10*time.Second)

	fail := func(e *Engine, body, want string) {
		t.Helper()
		status, out := c.completion(e.URL()+"/v1/completions", body)
		if status != 500 || out.Error == nil || out.Error.Type != "InternalServerError" || !strings.Contains(out.Error.Message, want) {
			t.Fatalf("want a 500 with %q, got %d %+v", want, status, out.Error)
		}
	}

	// The lease runs out: the blocks are freed unread and the pull fails.
	req, kv := prefillOnce(t, c, p, "expire")
	eventually(t, "the lease to run out", func() bool { s := p.Stats(); return s.ExpiredReqs == 1 && s.HeldBlocks == 0 })
	if s := p.Stats(); s.UsedBlocks != 0 || s.ExpiredBlocks == 0 {
		t.Fatalf("after expiry: %+v", s)
	}
	fail(d, decodeBody(req, kv), "expired")
	// With kv_load_failure_policy recompute the same request is computed locally.
	status, out := c.completion(dr.URL()+"/v1/completions", decodeBody(req, kv))
	if status != 200 || out.Usage.PromptTokensDetails.CachedTokens != 0 || dr.Stats().PullsFailed != 1 {
		t.Fatalf("recompute: %d %+v %+v", status, out, dr.Stats())
	}

	// A second pull of the same blocks fails: the first freed them.
	p = startEngine(t, pdConfig(RolePrefill)) // the default lease from here on
	req, kv = prefillOnce(t, c, p, "twice")
	if status, out := c.completion(d.URL()+"/v1/completions", decodeBody(req, kv)); status != 200 {
		t.Fatalf("first pull: %d %+v", status, out)
	}
	d2 := startEngine(t, pdConfig(RoleDecode)) // an empty cache, so it has to read every block
	fail(d2, decodeBody(req, kv), "already pulled")
	// The decode sim that holds them now only tells the prefill engine to free: a failed
	// notification, and the request runs on its local hit.
	status, out = c.completion(d.URL()+"/v1/completions", decodeBody(req, kv))
	if status != 200 || out.Usage.PromptTokensDetails.CachedTokens == 0 || d.Stats().FailedNotifs != 1 {
		t.Fatalf("local hit after the pull: %d %+v %+v", status, out, d.Stats())
	}

	// An unknown engine id.
	req, kv = prefillOnce(t, c, p, "engine")
	bad := strings.Replace(string(kv), `"engine-prefill"`, `"engine-other"`, 1)
	fail(d2, decodeBody(req, json.RawMessage(bad)), "unknown engine id")
	// The refused pull left the blocks held; the lease frees them.
	if p.Stats().HeldBlocks == 0 {
		t.Fatal("a refused pull freed the blocks")
	}

	// A peer that answers garbage, and one that is not there.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(conn, "\x00\xffnot http at all\r\n\r\n")
			_ = conn.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	garbage := strings.Replace(string(kv), strconv.Itoa(p.sideChannelPort()), strconv.Itoa(port), 1)
	fail(d2, decodeBody(req, json.RawMessage(garbage)), "cannot load KV blocks")
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closedPort := closed.Addr().(*net.TCPAddr).Port
	_ = closed.Close()
	gone := strings.Replace(string(kv), strconv.Itoa(p.sideChannelPort()), strconv.Itoa(closedPort), 1)
	fail(d2, decodeBody(req, json.RawMessage(gone)), "cannot load KV blocks")

	// A failed pull in a stream is an error event, then [DONE], as vLLM streams errors.
	sreq := map[string]any{"model": "sim-model", "prompt": req["prompt"], "max_tokens": 3, "stream": true}
	st, s := c.stream(d2.URL()+"/v1/completions", decodeBody(sreq, json.RawMessage(gone)))
	if st != 200 || !s.done || len(s.events) != 1 || !strings.Contains(s.events[0], `"InternalServerError"`) {
		t.Fatalf("stream failure: %d %+v", st, s)
	}

	m := c.metrics(d2.URL())
	if m["vllm:nixl_num_failed_transfers_total"] != 5 || d2.Stats().PullsFailed != 5 {
		t.Fatalf("decode failed transfers %v", m["vllm:nixl_num_failed_transfers_total"])
	}
	if pm := c.metrics(short.URL()); pm["vllm:nixl_num_kv_expired_reqs_total"] != 1 {
		t.Fatalf("prefill expired reqs %v", pm["vllm:nixl_num_kv_expired_reqs_total"])
	}
}

func TestDisaggHostileInput(t *testing.T) {
	p := startEngine(t, pdConfig(RolePrefill))
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 10*time.Second)
	f := func(e *Engine, kv, want string) {
		t.Helper()
		body := `{"model":"sim-model","prompt":"hello there","kv_transfer_params":` + kv + `}`
		status, out := c.completion(e.URL()+"/v1/completions", body)
		if status != 400 || out.Error == nil || out.Error.Type != "BadRequestError" || !strings.Contains(out.Error.Message, want) {
			t.Fatalf("%s: want a 400 with %q, got %d %+v", kv, want, status, out.Error)
		}
	}
	for _, e := range []*Engine{p, d} {
		f(e, `"yes"`, "kv_transfer_params must be an object")
		f(e, `[1]`, "kv_transfer_params must be an object")
		f(e, `{"do_remote_prefill":"true"}`, "do_remote_prefill must be a boolean")
		f(e, `{"do_remote_decode":1}`, "do_remote_decode must be a boolean")
		f(e, `{"remote_block_ids":"1,2"}`, "remote_block_ids must be a list")
		f(e, `{"remote_block_ids":[1,-2]}`, "remote_block_ids must be a list")
		f(e, `{"remote_block_ids":[[1],[2]]}`, "more than one KV cache group")
		f(e, `{"remote_port":"5600"}`, "remote_port must be a port")
		f(e, `{"remote_port":70000}`, "remote_port must be a port")
		f(e, `{"remote_host":5}`, "remote_host must be a printable string")
		f(e, `{"remote_engine_id":"a\nb"}`, "remote_engine_id must be a printable string")
	}
	// Params missing a field are served without a transfer, as vLLM does.
	status, out := c.completion(d.URL()+"/v1/completions", `{"prompt":"hello there","kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1]}}`)
	if status != 200 || out.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("incomplete params: %d %+v", status, out)
	}

	// The side channel refuses garbage and keeps serving.
	side := "http://" + p.SideChannelAddr()
	g := func(method, path, body string, want int) {
		t.Helper()
		var status int
		var b []byte
		if method == "GET" {
			status, b = c.get(side + path)
		} else {
			var err error
			status, _, b, err = c.post(side+path, body)
			if err != nil {
				t.Fatal(err)
			}
		}
		if status != want || !strings.Contains(string(b), `"error"`) {
			t.Fatalf("%s %s %q: %d %s", method, path, body, status, b)
		}
	}
	g("POST", "/pull", "{not json", 400)
	g("POST", "/pull", `[]`, 400)
	g("POST", "/pull", `{"engine_id":"engine-prefill","request_id":"x","block_ids":"all"}`, 400)
	g("POST", "/pull", `{"engine_id":"engine-prefill","request_id":"x","block_ids":[99999999999]}`, 400)
	g("POST", "/pull", `{"engine_id":"engine-prefill","request_id":"nobody","block_ids":[]}`, 404)
	g("POST", "/pull", `{"engine_id":"someone","request_id":"x","block_ids":[]}`, 400)
	g("GET", "/pull", "", 404)
	conn, err := net.Dial("tcp", p.SideChannelAddr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("\x16\x03\x01garbage garbage\r\n\r\n"))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.ReadAll(conn)
	_ = conn.Close()

	req, kv := prefillOnce(t, c, p, "after-garbage")
	var offer kvOffer
	_ = json.Unmarshal(kv, &offer)
	// A pull naming a block the request does not hold is refused and frees nothing.
	g("POST", "/pull", `{"engine_id":"engine-prefill","request_id":"`+offer.RemoteRequestID+`","block_ids":[4000000]}`, 400)
	if status, out := c.completion(d.URL()+"/v1/completions", decodeBody(req, kv)); status != 200 || out.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("pull after garbage: %d %+v", status, out)
	}
	if s := p.Stats(); s.PullsServed != 1 || s.PullsRefused != 8 {
		t.Fatalf("prefill stats %+v", s)
	}
}

// TestDisaggNoLeak runs many prefills and decodes at once; afterwards neither sim holds a block
// for a request.
func TestDisaggNoLeak(t *testing.T) {
	pc := pdConfig(RolePrefill)
	pc.MaxNumSeqs = 4
	p := startEngine(t, pc)
	d := startEngine(t, pdConfig(RoleDecode))
	c := newClient(t, 20*time.Second)
	var wg sync.WaitGroup
	const n = 40
	errs := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every fourth request shares a prefix with the others: hits on both sides.
			seed := "leak" + strconv.Itoa(i)
			if i%4 == 0 {
				seed = "shared"
			}
			req := map[string]any{"model": "sim-model", "prompt": words(seed, 40+i), "max_tokens": 2}
			p2 := map[string]any{"model": "sim-model", "prompt": req["prompt"], "max_tokens": 1,
				"kv_transfer_params": map[string]any{"do_remote_decode": true}}
			body, _ := json.Marshal(p2)
			status, _, b, err := c.post(p.URL()+"/v1/completions", string(body))
			if err != nil || status != 200 {
				errs <- "prefill: " + string(b)
				return
			}
			var pa struct {
				KV json.RawMessage `json:"kv_transfer_params"`
			}
			_ = json.Unmarshal(b, &pa)
			if i%5 == 0 {
				return // never decoded: the lease frees these
			}
			if status, _, b, err := c.post(d.URL()+"/v1/completions", decodeBody(req, pa.KV)); err != nil || status != 200 {
				errs <- "decode: " + string(b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	if s := p.Stats(); s.HeldBlocks == 0 {
		t.Fatalf("unpulled prefills hold nothing: %+v", s)
	}
	p.mu.Lock()
	for _, h := range p.holds {
		h.timer.Reset(time.Millisecond) // end the lease now
	}
	p.mu.Unlock()
	eventually(t, "every block to be freed", func() bool {
		s, ds := p.Stats(), d.Stats()
		return s.HeldBlocks == 0 && s.UsedBlocks == 0 && s.Running == 0 && ds.UsedBlocks == 0 && ds.Running == 0
	})
	if s := p.Stats(); s.ExpiredReqs != n/5 || s.PullsServed != n-n/5 || s.RemotePrefills != n {
		t.Fatalf("prefill stats %+v", s)
	}
	if ds := d.Stats(); ds.PullsFailed != 0 || ds.RemoteDecodes != n-n/5 {
		t.Fatalf("decode stats %+v", ds)
	}
}

func TestDisaggRoles(t *testing.T) {
	c := newClient(t, 10*time.Second)
	// An aggregated engine ignores kv_transfer_params: no offer, nothing held.
	a := startEngine(t, testConfig())
	req := map[string]any{"model": "sim-model", "prompt": words("agg", 60)}
	raw, _ := prefillHop(t, c, a.URL(), "/v1/completions", req)
	if len(raw) != 0 || a.Stats().UsedBlocks != 0 || a.SideChannelAddr() != "" {
		t.Fatalf("aggregated engine: offer %s, %+v", raw, a.Stats())
	}
	// kv_both engines play either part, as each request's params say.
	x, y := pdConfig(RoleBoth), pdConfig(RoleBoth)
	x.EngineID, y.EngineID = "x", "y"
	ex, ey := startEngine(t, x), startEngine(t, y)
	for _, pair := range [][2]*Engine{{ex, ey}, {ey, ex}} {
		req := map[string]any{"model": "sim-model", "prompt": words("both"+pair[0].cfg.EngineID, 60), "max_tokens": 2}
		raw, pa := prefillHop(t, c, pair[0].URL(), "/v1/completions", req)
		if pa.KVTransferParams == nil || pa.KVTransferParams.RemoteEngineID != pair[0].cfg.EngineID {
			t.Fatalf("both: offer %s", raw)
		}
		status, out := c.completion(pair[1].URL()+"/v1/completions", decodeBody(req, raw))
		if status != 200 || out.Usage.PromptTokensDetails.CachedTokens == 0 {
			t.Fatalf("both: decode %d %+v", status, out)
		}
	}
	// A decode engine serves a request without kv_transfer_params as an ordinary one.
	d := startEngine(t, pdConfig(RoleDecode))
	if status, out := c.completion(d.URL()+"/v1/completions", `{"prompt":"plain request"}`); status != 200 || out.Usage.CompletionTokens != 4 {
		t.Fatalf("plain request on a decode engine: %d %+v", status, out)
	}
	// A prompt shorter than a block offers no blocks and holds nothing; the decode computes it.
	p := startEngine(t, pdConfig(RolePrefill))
	short := map[string]any{"model": "sim-model", "prompt": "hi", "max_tokens": 2}
	raw, pa := prefillHop(t, c, p.URL(), "/v1/completions", short)
	if pa.KVTransferParams == nil || len(pa.KVTransferParams.RemoteBlockIDs) != 0 || p.Stats().UsedBlocks != 0 {
		t.Fatalf("short prompt: %s %+v", raw, p.Stats())
	}
	if status, out := c.completion(d.URL()+"/v1/completions", decodeBody(short, raw)); status != 200 {
		t.Fatalf("short prompt decode: %d %+v", status, out)
	}
}

// TestStopDisaggLeavesNoGoroutines: held blocks, their lease timers, the side channel and the
// decode side's pull connections all end with Stop.
func TestStopDisaggLeavesNoGoroutines(t *testing.T) {
	c := newClient(t, 10*time.Second)
	p, err := New(pdConfig(RolePrefill))
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(pdConfig(RoleDecode))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	req, kv := prefillOnce(t, c, p, "stop-pulled")
	if status, out := c.completion(d.URL()+"/v1/completions", decodeBody(req, kv)); status != 200 {
		t.Fatalf("decode: %d %+v", status, out)
	}
	prefillOnce(t, c, p, "stop-held") // still held when the engine stops
	p.Stop()
	d.Stop()
	c.tr.CloseIdleConnections()
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
