//go:build !race

package engine

import (
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/promptkey"
)

// responsesTurns is a Responses body with a prompt_cache_key, instructions and two turns: its opening (the
// instructions and the first user turn) is shorter than its key.
var responsesTurns = `{"model":"m","stream":true,"prompt_cache_key":"conv-\u0031","instructions":"` +
	strings.Repeat("You are a helpful assistant. ", 40) + `","input":[` +
	`{"type":"message","role":"user","content":[{"type":"input_text","text":"turn 1"}]},` +
	`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"turn 2"}]}]}`

// identityMark is the first byte of a prompt key that starts with the identity prefix (promptkey's
// keyIdentity, the ASCII group separator).
const identityMark = 0x1d

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
			ep            promptkey.Endpoint
			body, session string
			identity      bool
		}{
			{promptkey.Responses, responsesTurns, "conv-1", false},
			{promptkey.Chat, strings.Replace(chat20, `"model":"m"`, `"model":"m","user":"u\u0031"`, 1), "agent-1", true},
		} {
			ctx.Request.SetBodyString(r.body)
			ctx.Request.Header.Set("X-Agent-Session", "agent-1")
			c := g.acquireCall(g.acquireSnapshot())
			c.ep = r.ep
			if e := readAndPrepare(c, ctx); e != nil {
				t.Fatal(e.message)
			}
			p := &c.pick
			if string(p.SessionID) != r.session || (p.Key[0] == identityMark) != r.identity || !(p.Opening > 0 && p.Opening < len(p.Key)) {
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
