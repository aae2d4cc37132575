//go:build !race

package engine

import (
	"strings"
	"testing"
)

// TestAllocsScanShapes: the new request shapes, the identity prefix (fields moved into place, escaped
// values hashed past the key's end) and prompt_cache_key keep the scan's contract - no allocation once the
// key buffer and the scratch have grown.
func TestAllocsScanShapes(t *testing.T) {
	for _, sb := range shapeBodies {
		s := requestScanner{keyFields: []string{"user"}}
		var info requestInfo
		b := []byte(sb.body)
		if e := s.scan(b, sb.ep, nil, &info); e != nil {
			t.Fatalf("%s: %s", sb.name, e.message)
		}
		key := info.key
		if a := testing.AllocsPerRun(20, func() {
			if e := s.scan(b, sb.ep, key[:0], &info); e != nil {
				t.Fatal(e.message)
			}
			key = info.key
		}); a != 0 {
			t.Fatalf("%s: %v allocs per scan", sb.name, a)
		}
	}
}

// TestAllocsSessionAndOpening: the routing path up to the pick with a session key from the body or an
// operator header, and consistent_hash on the opening, allocates nothing.
func TestAllocsSessionAndOpening(t *testing.T) {
	for _, strategy := range []string{"consistent_hash", "pipeline", "cache_aware"} {
		g, ctx := benchCallExtra(t, strategy, "")
		cfg := *g.Snapshot().cfg
		cfg.Server.SessionHeaders = []string{"x-agent-session"}
		cfg.Server.CacheKeyFields = []string{"user"}
		if err := g.Reload(&cfg); err != nil {
			t.Fatal(err)
		}
		for _, r := range []struct {
			ep            endpoint
			body, session string
			identity      bool
		}{
			{epResponses, shapeBodies[0].body, "conv-1", false},
			{epChat, strings.Replace(chat20, `"model":"m"`, `"model":"m","user":"u\u0031"`, 1), "agent-1", true},
		} {
			ctx.Request.SetBodyString(r.body)
			ctx.Request.Header.Set("X-Agent-Session", "agent-1")
			c := g.acquireCall(g.acquireSnapshot())
			c.ep = r.ep
			if e := readAndPrepare(c, ctx); e != nil {
				t.Fatal(e.message)
			}
			p := &c.pick
			if string(p.SessionID) != r.session || (p.Key[0] == keyIdentity) != r.identity || !(p.Opening > 0 && p.Opening < len(p.Key)) {
				t.Fatalf("%s: session %q, key %q..., opening %d of %d", strategy, p.SessionID, p.Key[:16], p.Opening, len(p.Key))
			}
			if a := testing.AllocsPerRun(200, func() {
				c.route = nil
				if e := readAndPrepare(c, ctx); e != nil {
					t.Fatal(e.message)
				}
			}); a != 0 {
				t.Fatalf("%s: %v allocs per request up to the pick", strategy, a)
			}
			c.release()
		}
	}
}
