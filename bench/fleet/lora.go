package fleet

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// StartLoRA starts n engines with simCfg serving adapters (every engine registers every adapter, as
// --lora-modules does: a fleet whose adapters are all on shared storage) and a gateway in front of them.
// With aware, the gateway's one route is the base model with [routes.lora] naming the adapters (extra
// appended to that section) and strategy ranking each adapter's home set; without, every adapter is a route
// of its own over every engine with strategy, as a gateway that knows adapters only as model names routes
// them. On any error everything started is stopped.
func StartLoRA(n int, simCfg sim.Config, adapters []string, strategy string, aware bool, extra string, log *slog.Logger) (*Fleet, error) {
	if err := CheckStrategy(n, strategy); err != nil {
		return nil, err
	}
	f := &Fleet{}
	ok := false
	defer func() {
		if !ok {
			f.Stop()
		}
	}()
	simCfg.EnableLoRA = true
	simCfg.LoRAModules = nil
	for _, a := range adapters {
		simCfg.LoRAModules = append(simCfg.LoRAModules, sim.LoRAModule{Name: a, Path: "/adapters/" + a})
	}
	for i := range n {
		c := simCfg
		c.EngineLabel = fmt.Sprint(i)
		c.Port, c.KVEvents, c.Replay = 0, "", ""
		e, err := sim.New(c)
		if err != nil {
			return nil, fmt.Errorf("cannot configure simulated engine %d: %w", i+1, err)
		}
		if err := e.Start(); err != nil {
			return nil, fmt.Errorf("cannot start simulated engine %d: %w", i+1, err)
		}
		f.Sims = append(f.Sims, e)
		f.Names = append(f.Names, fmt.Sprintf("sim-%d", i+1))
		if err := WaitHTTP(context.Background(), e.URL()+"/health", 10*time.Second, nil); err != nil {
			return nil, fmt.Errorf("simulated engine %d does not answer: %w", i+1, err)
		}
	}
	urls := f.URLs()
	if err := f.startGateway(func(listen string) string {
		return LoRAConfig(listen, strategy, urls, f.Sims[0].Config().Model, adapters, aware, extra)
	}, log); err != nil {
		return nil, err
	}
	ok = true
	return f, nil
}

// LoRAConfig renders the gateway config of a LoRA fleet (StartLoRA): Config's shape, and the adapters
// either as [routes.lora] of the base model's route (aware) or as routes of their own.
func LoRAConfig(listen, strategy string, urls []string, model string, adapters []string, aware bool, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[server]\nlisten = %q\n\n", listen)
	b.WriteString("[health]\nenabled = true\ninterval_secs = 1\n\n[metrics_scrape]\nenabled = true\ninterval_secs = 0.25\n\n")
	for i, u := range urls {
		fmt.Fprintf(&b, "[[providers]]\nname = \"sim-%d\"\napi_base = %q\n\n", i+1, u)
	}
	route := func(name string) {
		fmt.Fprintf(&b, "[[routes]]\nmodel = %q\nstrategy = %q\n", name, strategy)
		for i := range urls {
			fmt.Fprintf(&b, "\n[[routes.targets]]\nprovider = \"sim-%d\"\n", i+1)
		}
		b.WriteString("\n")
	}
	route(model)
	if aware {
		quoted := make([]string, len(adapters))
		for i, a := range adapters {
			quoted[i] = fmt.Sprintf("%q", a)
		}
		fmt.Fprintf(&b, "[routes.lora]\nadapters = [%s]\n%s\n", strings.Join(quoted, ", "), extra)
		return b.String()
	}
	for _, a := range adapters {
		route(a)
	}
	return b.String()
}
