//go:build cgo

package sim

import (
	"fmt"
	"testing"
	"time"
)

// TestDisaggKVEvents: both sims publish BlockStored for the prompt's full blocks, the prefill
// sim when it computes them, the decode sim when it caches the blocks it read.
func TestDisaggKVEvents(t *testing.T) {
	pc, dc := pdConfig(RolePrefill), pdConfig(RoleDecode)
	pc.KVEvents, dc.KVEvents = "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
	p, d := startEngine(t, pc), startEngine(t, dc)
	psub, dsub := newSub(t, p.KVEventsEndpoint(), ""), newSub(t, d.KVEventsEndpoint(), "")
	syncSub(t, p, psub)
	syncSub(t, d, dsub)
	c := newClient(t, 10*time.Second)

	req, kv := prefillOnce(t, c, p, "events")
	tokens := tokenize(t, c, p, `{"prompt":`+fmt.Sprintf("%q", req["prompt"])+`}`)
	want := fmt.Sprint(wire(tokens, p.Config().BlockSize))
	if _, b := recvBatch(t, psub, ""); len(b.events) != 1 || b.events[0].typ != "BlockStored" || fmt.Sprint(b.events[0].hashes) != want {
		t.Fatalf("prefill sim events %+v, want BlockStored %s", b.events, want)
	}
	if status, out := c.completion(d.URL()+"/v1/completions", decodeBody(req, kv)); status != 200 {
		t.Fatalf("decode: %d %+v", status, out)
	}
	_, b := recvBatch(t, dsub, "")
	if len(b.events) != 1 || b.events[0].typ != "BlockStored" || fmt.Sprint(b.events[0].hashes) != want {
		t.Fatalf("decode sim events %+v, want BlockStored %s", b.events, want)
	}
}
