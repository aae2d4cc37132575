package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// StartDisagg starts nPrefill prefill engines and nDecode decode engines with simCfg (vLLM's
// NixlConnector roles, each prefill engine with a side channel on a free loopback port) and a gateway
// whose one route is disaggregated over them, the shape `rolter up -pd` generates (cmd/rolter/up_pd.go):
// strategy over the prefill pool, the decode pool by load, extra appended to [routes.disaggregation].
// f.Sims holds the prefill engines, then the decode ones; f.Prefill says how many of them prefill and
// f.Names are the decode engines' names (x-rolter-target). decodeSeqs and prefillBlocks, when > 0, are the
// decode engines' max_num_seqs and the prefill engines' KV blocks. On any error everything started is
// stopped.
func StartDisagg(nPrefill, nDecode int, simCfg sim.Config, decodeSeqs, prefillBlocks int, strategy, extra string, log *slog.Logger) (*Fleet, error) {
	if err := CheckStrategy(nPrefill, strategy); err != nil {
		return nil, err
	}
	f := &Fleet{Prefill: nPrefill}
	ok := false
	defer func() {
		if !ok {
			f.Stop()
		}
	}()
	for i := 0; i < nPrefill+nDecode; i++ {
		c := simCfg
		c.EngineLabel = fmt.Sprint(i)
		c.Port, c.KVEvents, c.Replay = 0, "", ""
		c.Role, c.SideChannelPort, c.SideChannelHost = sim.RolePrefill, 0, "127.0.0.1"
		if prefillBlocks > 0 {
			c.NumBlocks = prefillBlocks
		}
		if i >= nPrefill {
			c.NumBlocks = simCfg.NumBlocks
			c.Role = sim.RoleDecode
			if decodeSeqs > 0 {
				c.MaxNumSeqs = decodeSeqs
			}
		}
		e, err := sim.New(c)
		if err != nil {
			return nil, fmt.Errorf("cannot configure simulated %s engine %d: %w", c.Role, i+1, err)
		}
		if err := e.Start(); err != nil {
			return nil, fmt.Errorf("cannot start simulated %s engine %d: %w", c.Role, i+1, err)
		}
		f.Sims = append(f.Sims, e)
		if i >= nPrefill {
			f.Names = append(f.Names, fmt.Sprintf("decode-%d", i-nPrefill+1))
		}
		if err := WaitHTTP(context.Background(), e.URL()+"/health", 10*time.Second, nil); err != nil {
			return nil, fmt.Errorf("simulated engine %d does not answer: %w", i+1, err)
		}
	}
	urls := f.URLs()
	if err := f.startGateway(func(listen string) string {
		return DisaggConfig(listen, strategy, extra, urls[:nPrefill], urls[nPrefill:], f.Sims[0].Config().Model)
	}, log); err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}

// DisaggConfig renders the gateway config of a disaggregated fleet: Config's shape with the prefill
// engines as the route's targets and the decode engines as its [routes.disaggregation] decode pool.
func DisaggConfig(listen, strategy, extra string, prefill, decode []string, model string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\n\n", listen)
	b.WriteString("[health]\nenabled = true\ninterval_secs = 1\n\n[metrics_scrape]\nenabled = true\ninterval_secs = 0.25\n\n")
	for i, u := range prefill {
		fmt.Fprintf(&b, "[[providers]]\nname = \"prefill-%d\"\napi_base = %q\n\n", i+1, u)
	}
	for i, u := range decode {
		fmt.Fprintf(&b, "[[providers]]\nname = \"decode-%d\"\napi_base = %q\n\n", i+1, u)
	}
	fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = %q\n", model, strategy)
	for i := range prefill {
		fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = \"prefill-%d\"\n", i+1)
	}
	fmt.Fprintf(&b, "\n[routes.disaggregation]\n%s\n", extra)
	for i := range decode {
		fmt.Fprintf(&b, "\n[[routes.disaggregation.decode]]\nprovider = \"decode-%d\"\n", i+1)
	}
	return b.String()
}
