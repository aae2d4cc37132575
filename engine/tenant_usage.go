package engine

import (
	"sync/atomic"

	"github.com/puzpuzpuz/xsync/v3"

	"github.com/rolter-ai/rolter/telemetry"
)

// usageBook is what each data-plane key used, by model: requests answered, requests its limits refused,
// and the tokens of the answers (prompt, cached, completion: the engines' usage, or the gateway's estimate
// where an answer had none). The control plane drains it into the store by hour (DrainUsage), and
// /metrics shows it per org, key and model - series as many as the keys and models that were used, which
// the config bounds. Recording is lock-free: one map lookup, atomic adds; a key's first request of a model
// makes its cell (one allocation).
type usageBook struct {
	cells *xsync.MapOf[usageID, *usageCell]
	set   *telemetry.Set
}

// usageID names a cell: the key's org and id, and the public model.
type usageID struct {
	org, key, model string
}

// usageCell is one cell's counts since the gateway started (for /metrics) and since the last drain.
type usageCell struct {
	total   usageCounts
	drained usageCounts // what DrainUsage has taken of total
}

type usageCounts struct {
	requests, refused, prompt, cached, completion atomic.Int64
}

func newUsageBook() *usageBook {
	b := &usageBook{cells: xsync.NewMapOf[usageID, *usageCell](), set: telemetry.NewSet()}
	b.set.Register()
	return b
}

// cell returns id's cell, making it (and its series) the first time.
func (b *usageBook) cell(id usageID) *usageCell {
	if c, ok := b.cells.Load(id); ok {
		return c
	}
	c, loaded := b.cells.LoadOrCompute(id, func() *usageCell { return &usageCell{} })
	if !loaded {
		l := "org=" + telemetry.Label(id.org) + ",key=" + telemetry.Label(id.key) + ",model=" + telemetry.Label(id.model)
		u := func(v *atomic.Int64) func() uint64 { return func() uint64 { return uint64(v.Load()) } }
		b.set.CounterFunc(telemetry.TenantRequests, l+`,result="answered"`, u(&c.total.requests))
		b.set.CounterFunc(telemetry.TenantRequests, l+`,result="refused"`, u(&c.total.refused))
		b.set.CounterFunc(telemetry.TenantTokens, l+`,kind="prompt"`, u(&c.total.prompt))
		b.set.CounterFunc(telemetry.TenantTokens, l+`,kind="cached"`, u(&c.total.cached))
		b.set.CounterFunc(telemetry.TenantTokens, l+`,kind="completion"`, u(&c.total.completion))
	}
	return c
}

// UsageRow is what one key used of one model between two drains.
type UsageRow struct {
	Org, Key, Model                              string
	Requests, Refused                            int64
	PromptTokens, CachedTokens, CompletionTokens int64
}

// DrainUsage appends to dst what each key used of each model since the last drain and returns it; cells
// with nothing new are left out. Concurrent requests are counted in this drain or the next, never both.
func (g *Gateway) DrainUsage(dst []UsageRow) []UsageRow {
	g.usage.cells.Range(func(id usageID, c *usageCell) bool {
		take := func(total, drained *atomic.Int64) int64 {
			v := total.Load()
			return v - drained.Swap(v)
		}
		row := UsageRow{Org: id.org, Key: id.key, Model: id.model,
			Requests: take(&c.total.requests, &c.drained.requests), Refused: take(&c.total.refused, &c.drained.refused),
			PromptTokens: take(&c.total.prompt, &c.drained.prompt), CachedTokens: take(&c.total.cached, &c.drained.cached),
			CompletionTokens: take(&c.total.completion, &c.drained.completion)}
		if row.Requests+row.Refused+row.PromptTokens+row.CompletionTokens > 0 {
			dst = append(dst, row)
		}
		return true
	})
	return dst
}

// recordUsage counts a keyed request's end in its key's cell: refused by a limit, or answered with the
// tokens it used (the usage the answer carried, else the prompt's estimate and the stream events passed on,
// as settleLimits charges them; an error answer counts as a request with no tokens).
func (c *call) recordUsage(status int) {
	k := c.tenant
	if k == nil {
		return
	}
	cell := c.g.usage.cell(usageID{org: k.org, key: k.id, model: c.tenantModel})
	if c.limitRefused {
		cell.total.refused.Add(1)
		return
	}
	cell.total.requests.Add(1)
	if (status < 200 || status >= 300) && c.events == 0 {
		return
	}
	if u := c.usage.figures(); u.found {
		cell.total.prompt.Add(u.prompt)
		cell.total.cached.Add(u.cached)
		cell.total.completion.Add(u.completed)
		return
	}
	cell.total.prompt.Add(estimateTokens(len(c.key)))
	cell.total.completion.Add(c.events)
}
