//go:build cgo

package engine

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/kvindex"
	"github.com/rolter-ai/rolter/sim"
)

// sharedBindConfig renders a precise_cache_aware route over engines whose providers all bind endpoint,
// provider sim-i with topic kv@sim-i (the sims' topics).
func sharedBindConfig(engines []*sim.Engine, endpoint string) string {
	var b strings.Builder
	b.WriteString("[server]\nlisten = \"127.0.0.1:0\"\n")
	for i, e := range engines {
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n[providers.kv_events]\nendpoint = %q\nmode = \"bind\"\n"+
			"topic = \"kv@sim-%d\"\nstale_secs = 60\n", i, e.URL(), endpoint, i)
	}
	b.WriteString("[[routes]]\nmodel = \"m\"\nstrategy = \"precise_cache_aware\"\n")
	for i := range engines {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"sim-%d\"\nmodel = \"sim-model\"\n", i)
	}
	return b.String()
}

// TestSharedBindEndpoint: four engines publish to one endpoint the gateway binds (llm-d style, the topic
// names the engine), and each is ingested under its own provider, with its own stream and index; a
// reload that removes one provider keeps the others' sources and streams as they are.
func TestSharedBindEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "tcp://" + ln.Addr().String()
	ln.Close()
	// The sims connect (their endpoint names a host) and publish under topic kv@sim-<label>.
	engines, _ := simFleet(t, 4, func(c *sim.Config) { c.KVEvents = endpoint; c.Topic = "kv@sim-" + c.EngineLabel })
	gw := startGateway(t, sharedBindConfig(engines, endpoint))
	kv := gw.g.Snapshot().kv
	if m := metricsText(t, gw); !strings.Contains(m, `rolter_kv_stream_trust{target="sim-2"} 2`) ||
		!strings.Contains(m, `rolter_kv_stream_trust_reason{target="sim-2",reason="no_events_yet"} 1`) {
		t.Fatalf("before any event the streams are not fallback/no_events_yet:\n%s", grepLines(m, "trust"))
	}
	// Engine i serves its own conversation (sent to it directly), until its events got through: a
	// publisher's first batches may go out before it is connected (ZMQ's slow joiner).
	ids := make([]string, len(engines))
	for i, e := range engines {
		src := kv[fmt.Sprintf("sim-%d", i)]
		deadline := time.Now().Add(10 * time.Second)
		for n := 0; src.st.Stats().StoredEvents == 0; n++ {
			if time.Now().After(deadline) {
				t.Fatalf("sim-%d's events never reached its provider: %+v", i, src.st.Stats())
			}
			msgs := longConversation(fmt.Sprintf("shared %d %d", i, n))
			ids[i] = tokenize(t, e, msgs)
			body := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
				msgs[0].Content, msgs[1].Content)
			if resp, got := post(t, e.URL()+"/v1/chat/completions", body); resp.StatusCode != 200 {
				t.Fatalf("sim-%d: %d %s", i, resp.StatusCode, got)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for i := range engines {
		name := fmt.Sprintf("sim-%d", i)
		waitResident(t, gw, name, ids[i])
		toks, _ := parseTokenIDs(nil, []byte(ids[i]))
		out := make([]int, gw.g.kv.ix.MaxTargets())
		var s kvindex.Scratch
		full := gw.g.kv.ix.Match(toks, &s, out)
		for j := range engines {
			if other := kv[fmt.Sprintf("sim-%d", j)]; j != i && out[other.id] == full {
				t.Fatalf("%s's conversation is resident on sim-%d too", name, j)
			}
		}
		if st := kv[name].st.Stats(); !st.Trusted || st.Restarts != 0 || st.GarbageFrames != 0 {
			t.Fatalf("%s: unexpected stream %+v", name, st)
		}
	}

	// A reload removes sim-3: the others keep their sources (and their socket: it is shared).
	before := map[string]uint64{}
	for name, src := range kv {
		before[name] = src.st.Stats().Batches
	}
	cfg := sharedBindConfig(engines, endpoint)
	mustReload(t, gw, dropProvider(cfg, "sim-3"))
	waitSettled(t, gw)
	after := gw.g.Snapshot().kv
	if len(after) != 3 || after["sim-3"] != nil {
		t.Fatalf("sources after the reload: %v", after)
	}
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("sim-%d", i)
		if after[name] != kv[name] {
			t.Fatalf("the reload replaced %s's source", name)
		}
	}
	if kv["sim-3"].holds != 0 || gw.g.kv.used[kv["sim-3"].id] {
		t.Fatal("the removed provider's source is still live")
	}
	// sim-0 publishes again, on the socket it never left.
	msgs := longConversation("after the reload")
	body := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		msgs[0].Content, msgs[1].Content)
	if resp, got := post(t, engines[0].URL()+"/v1/chat/completions", body); resp.StatusCode != 200 {
		t.Fatalf("sim-0: %d %s", resp.StatusCode, got)
	}
	st := after["sim-0"].st
	waitFor(t, 5*time.Second, "sim-0's next batch", func() bool { return st.Stats().Batches > before["sim-0"] })
	if s := st.Stats(); !s.Trusted || s.Gaps != 0 || s.Restarts != 0 {
		t.Fatalf("sim-0 after the reload: %+v", s)
	}
	if m := metricsText(t, gw); !strings.Contains(m, `rolter_kv_stream_trust{target="sim-0"} 0`) ||
		strings.Contains(m, `rolter_kv_stream_trust{target="sim-3"}`) {
		t.Fatalf("trust series after the reload:\n%s", grepLines(m, "rolter_kv_stream_trust{"))
	}
}
