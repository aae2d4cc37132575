package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/kvindex"
)

// storedBatch encodes one vLLM KV-event batch (positional era with medium and lora_name) storing tokens as
// consecutive blocks with engine hashes base, base+1, ...
func storedBatch(tokens []uint32, base uint64) []byte {
	var b []byte
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendFloat64(b, 1.7e9)
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendArrayHeader(b, 8)
	b = msgp.AppendString(b, "BlockStored")
	n := len(tokens) / 16
	b = msgp.AppendArrayHeader(b, uint32(n))
	for i := 0; i < n; i++ {
		b = msgp.AppendUint64(b, base+uint64(i))
	}
	b = msgp.AppendNil(b)
	b = msgp.AppendArrayHeader(b, uint32(n*16))
	for _, t := range tokens[:n*16] {
		b = msgp.AppendUint32(b, t)
	}
	b = msgp.AppendInt(b, 16)
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "GPU")
	b = msgp.AppendNil(b)
	return msgp.AppendInt(b, 0)
}

// preciseRoute returns a precise_cache_aware route over n targets whose index holds, per target t, the
// first (t+1)/n of tokens: every target matches a different prefix, the last one all of it.
func preciseRoute(tb testing.TB, n int, tokens []uint32) *Route {
	tb.Helper()
	if !kvindex.Supported {
		tb.Skip("kv_events needs cgo")
	}
	var b strings.Builder
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[[providers]]\nname = \"p%d\"\napi_base = \"http://127.0.0.1:%d\"\n[providers.kv_events]\nendpoint = \"tcp://127.0.0.1:%d\"\n", i, 30000+i, 31000+i)
	}
	b.WriteString("[[routes]]\nmodel = \"m\"\nstrategy = \"round_robin\"\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "[[routes.targets]]\nprovider = \"p%d\"\n", i)
	}
	cfg, err := config.Parse([]byte(b.String()), "p.toml")
	if err != nil {
		tb.Fatal(err)
	}
	s := testSnapshot(tb, cfg)
	// KV-event sources fed by hand instead of ZMQ subscribers.
	env := &buildEnv{kv: &kvState{ix: kvindex.NewIndex(n)}, kvSources: map[string]*kvSource{}}
	for i := 0; i < n; i++ {
		st := kvindex.NewStream(env.kv.ix.Target(i, 1<<20), kvindex.StreamConfig{})
		cut := len(tokens) * (i + 1) / n
		st.Handle(nil, 0, storedBatch(tokens[:cut], uint64(i)<<32), time.Now())
		if !st.Trusted() {
			tb.Fatalf("stream %d not trusted: %s", i, st.Reason())
		}
		env.kvSources[fmt.Sprintf("p%d", i)] = &kvSource{id: i, st: st}
	}
	r := s.Routes[0]
	st, err := newPrecise(r, config.RouteParams{}, env)
	if err != nil {
		tb.Fatal(err)
	}
	r.Strategy = st
	r.bound = newLoadBound(r, config.DefaultLoadBound("precise_cache_aware"))
	return r
}

func BenchmarkPrecisePick(b *testing.B) {
	tokens := make([]uint32, 32<<10)
	for i := range tokens {
		tokens[i] = uint32(i*7919) % 32000
	}
	r := preciseRoute(b, 16, tokens)
	var buf, out [maxTargets]int
	var kvOut [kvindex.MaxTargets]int
	var scratch kvindex.Scratch
	var p Pick
	allEligible(r, &p, buf[:])
	p.TokenIDs, p.TokenIDsState, p.kvScratch, p.kvOut = tokens, tokenIDsOK, &scratch, kvOut[:]
	b.ReportAllocs()
	for b.Loop() {
		r.Strategy.Rank(&p, out[:])
	}
	if out[0] != 15 {
		b.Fatalf("picked %d, want the target holding the whole prompt", out[0])
	}
}
