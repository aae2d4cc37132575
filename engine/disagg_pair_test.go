package engine

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/internal/freeport"
	"github.com/rolter-ai/rolter/sim"
)

// rooms is where fake SGLang engines meet: each side notes the rooms it was sent, and a prefill engine
// answers only once its decode peer has its half - so a gateway that waited for the prefill's answer before
// sending the decode request would hang.
type rooms struct {
	mu      sync.Mutex
	decode  map[float64]bool
	prefill map[float64]bool // rooms whose prefill is done
}

func (rs *rooms) sawDecode(room float64) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.decode[room]
}

func roomOf(r *http.Request) (float64, map[string]any) {
	b, _ := io.ReadAll(r.Body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	room, _ := m["bootstrap_room"].(float64)
	return room, m
}

// sgPrefill answers once the room's decode request arrived (or fails with status when it is not 200).
func (rs *rooms) sgPrefill(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		room, _ := roomOf(r)
		deadline := time.Now().Add(3 * time.Second)
		for !rs.sawDecode(room) && time.Now().Before(deadline) && r.Context().Err() == nil {
			time.Sleep(time.Millisecond)
		}
		if status != 200 {
			http.Error(w, "prefill failed", status)
			return
		}
		rs.mu.Lock()
		rs.prefill[room] = true
		rs.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"},"finish_reason":"length"}],"usage":{"prompt_tokens":300,"completion_tokens":1,"total_tokens":301,"prompt_tokens_details":{"cached_tokens":64}}}`)
	}
}

// sgDecode notes the room, waits for its prefill to be done (the KV to arrive), then answers with h.
func (rs *rooms) sgDecode(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		room, m := roomOf(r)
		rs.mu.Lock()
		rs.decode[room] = true
		rs.mu.Unlock()
		done := func() bool {
			rs.mu.Lock()
			defer rs.mu.Unlock()
			return rs.prefill[room]
		}
		for !done() {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
		b, _ := json.Marshal(m)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		h(w, r)
	}
}

func newRooms() *rooms { return &rooms{decode: map[float64]bool{}, prefill: map[float64]bool{}} }

// TestDisaggSGLangWire: both engines get the client's body with the same bootstrap members, as SGLang's
// mini_lb sends them, and the pair is written before either answer is awaited.
func TestDisaggSGLangWire(t *testing.T) {
	rs := newRooms()
	p := newPDEngine(t, rs.sgPrefill(200))
	d := newPDEngine(t, rs.sgDecode(decodeOK))
	gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "cache_aware", `protocol = "sglang"`+"\nbootstrap_port = 8999", ""))
	body := `{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 2 {
		resp, out := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 || !strings.Contains(out, "[DONE]") || resp.Header.Get("X-Rolter-Prefill-Target") != "p0" {
			t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, out)
		}
		pb, _ := p.got()
		db, _ := d.got()
		var client map[string]any
		_ = json.Unmarshal([]byte(body), &client)
		room := pb[i]["bootstrap_room"]
		for side, got := range map[string]map[string]any{"prefill": pb[i], "decode": db[i]} {
			want := cloneMap(client)
			want["model"] = map[string]string{"prefill": "pm", "decode": "dm"}[side]
			want["bootstrap_host"], want["bootstrap_port"], want["bootstrap_room"] = "127.0.0.1", 8999.0, room
			sameAsProxy(t, side, got, want)
		}
		if r, ok := room.(float64); !ok || r < 0 || i == 1 && pb[0]["bootstrap_room"] == room {
			t.Fatalf("rooms %v then %v: want a new non-negative room per request", pb[0]["bootstrap_room"], room)
		}
		if !strings.Contains(out, `"cached_tokens":64`) {
			t.Fatalf("the answer's cached_tokens are not the prefill engine's: %s", out)
		}
	}
}

func TestDisaggSGLangFails(t *testing.T) {
	body := chatBody("m", "hello", true)
	t.Run("a failed prefill ends its pair; the retry is a new pair", func(t *testing.T) {
		rs := newRooms()
		bad := newPDEngine(t, rs.sgPrefill(500))
		good := newPDEngine(t, rs.sgPrefill(200))
		d := newPDEngine(t, rs.sgDecode(decodeOK))
		d1 := newPDEngine(t, rs.sgDecode(decodeOK))
		gw := startGateway(t, pdFakes([]string{bad.URL, good.URL}, []string{d.URL, d1.URL}, "round_robin", `protocol = "sglang"`, ""))
		for sent := 0; countOf(bad)[0] == 0; sent++ {
			if sent == 50 {
				t.Fatal("the failing prefill engine was never picked")
			}
			resp, out := post(t, gw.URL+"/v1/chat/completions", body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Prefill-Target") != "p1" {
				t.Fatalf("%d prefill=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Prefill-Target"), out)
			}
		}
		// The failed pair's decode half waited for a KV that never came: the gateway closed it.
		select {
		case <-d.gone:
		case <-d1.gone:
		case <-time.After(5 * time.Second):
			t.Fatal("the decode half of the failed pair was not cancelled")
		}
	})
	t.Run("a failed decode ends its pair", func(t *testing.T) {
		rs := newRooms()
		p := newPDEngine(t, rs.sgPrefill(200))
		bad := newPDEngine(t, rs.sgDecode(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "kv transfer failed", 500) }))
		good := newPDEngine(t, rs.sgDecode(decodeOK))
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{bad.URL, good.URL}, "round_robin", `protocol = "sglang"`, ""))
		sent := 0
		for countOf(bad)[0] == 0 && sent < 50 {
			sent++
			resp, out := post(t, gw.URL+"/v1/chat/completions", body)
			if resp.StatusCode != 200 || resp.Header.Get("X-Rolter-Target") != "d1" {
				t.Fatalf("%d decode=%q %s", resp.StatusCode, resp.Header.Get("X-Rolter-Target"), out)
			}
		}
		pb, _ := p.got()
		if n := countOf(p, bad, good); n[0] != sent+1 || n[1] != 1 || n[2] != sent {
			t.Fatalf("after %d requests: prefill %d, failing decode %d, good decode %d", sent, n[0], n[1], n[2])
		}
		if len(pb) >= 2 && pb[len(pb)-1]["bootstrap_room"] == pb[len(pb)-2]["bootstrap_room"] {
			t.Fatal("the retried pair reused the failed pair's room")
		}
	})
	t.Run("a client that leaves closes both", func(t *testing.T) {
		rs := newRooms()
		hang := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
		p := newPDEngine(t, hang)
		d := newPDEngine(t, rs.sgDecode(hang))
		gw := startGateway(t, pdFakes([]string{p.URL}, []string{d.URL}, "round_robin", `protocol = "sglang"`, ""))
		conn, err := net.Dial("tcp", gw.addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		waitFor(t, 5*time.Second, "both halves to arrive", func() bool { return p.requests.Load() == 1 && d.requests.Load() == 1 })
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
		for _, e := range []*pdEngine{p, d} {
			select {
			case <-e.gone:
			case <-time.After(5 * time.Second):
				t.Fatal("a half of the pair was not cancelled")
			}
		}
	})
}

// TestDisaggSGLangSim: an SGLang-protocol route over simulated SGLang prefill and decode engines (each
// prefill engine on its own loopback address, all with one bootstrap port, as a fleet of hosts has it):
// streamed and plain answers through rooms, the blocks moved, and the prefill engine chosen by its cache.
func TestDisaggSGLangSim(t *testing.T) {
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	prefill, decode, cfg := pdFleet(t, 2, 1, "cache_aware", "protocol = \"sglang\"\nbootstrap_port = "+strconv.Itoa(port), func(c *sim.Config) {
		if c.Role == sim.RolePrefill {
			n++
			c.Host, c.SideChannelHost, c.SideChannelPort = fmt.Sprintf("127.0.0.%d", 1+n), "", port
		}
	})
	gw := startGateway(t, cfg)
	msgs := strings.Repeat("a long shared system prompt for the sglang fleet. ", 30)
	var first string
	for i, stream := range []bool{false, true, false, true} {
		body := chatBody("m", msgs, stream)
		resp, out := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 || (stream && !strings.Contains(out, "[DONE]")) || strings.Contains(out, `"error"`) {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, out)
		}
		pt := resp.Header.Get("X-Rolter-Prefill-Target")
		if i == 0 {
			first = pt
		} else if pt != first {
			t.Fatalf("request %d was prefilled on %s, not %s which holds the prompt", i, pt, first)
		}
	}
	var served uint64
	for _, e := range prefill {
		served += e.Stats().RoomsServed
	}
	if d := decode[0].Stats(); served != 4 || d.RoomDecodes != 4 {
		t.Fatalf("rooms served %d, decode rooms %d; want 4 and 4", served, d.RoomDecodes)
	}
}
