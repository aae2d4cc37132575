package discovery

import (
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/egress"
)

// Endpoint states, as Status reports them.
const (
	StateLive        = "live"        // a target of the routes that name the source
	StateSettling    = "settling"    // ready for less than settle_secs
	StateNotReady    = "not_ready"   // known, takes no new requests
	StateTerminating = "terminating" // going away: takes no new requests, its streams finish
	StateCapped      = "capped"      // ready, beyond max_endpoints (or the route's target limit)
	StateRefused     = "refused"     // its address is one [egress] refuses
)

// expansion is one expanded config and what it was made of.
type expansion struct {
	cfg *config.Config
	// key identifies the discovered part (every live endpoint's provider, and its KV and LMCache
	// endpoints, in order): two expansions with the same key and base are the same config.
	key string
	// next is when a settling endpoint becomes live (zero if none is settling).
	next time.Time
	// endpoints are each source's endpoints with their states, for Status.
	endpoints map[string][]EndpointStatus
}

// expand returns base with every target that names a source replaced by one target per live endpoint of
// that source, and a provider per live endpoint, made from the source's template. base is not changed.
func expand(base *config.Config, sources map[string]*watched, policy *egress.Policy, now time.Time) *expansion {
	x := &expansion{endpoints: map[string][]EndpointStatus{}}
	live := map[string][]config.ProviderConfig{}
	for name, w := range sources {
		eps, states, next := w.view(now)
		if !next.IsZero() && (x.next.IsZero() || next.Before(x.next)) {
			x.next = next
		}
		sc := &w.cfg
		var ps []config.ProviderConfig
		st := make([]EndpointStatus, len(eps))
		made := make(map[Key]madeProvider, len(eps))
		for i := range eps {
			e := &eps[i]
			state := states[i]
			if state == StateLive && policy != nil && policy.CheckAddr(sc.Name, e.Addr.Addr()) != nil {
				state = StateRefused
			}
			if state == StateLive && len(ps) >= sc.MaxEndpoints {
				state = StateCapped
			}
			p := w.provider(e, made)
			if state == StateLive {
				ps = append(ps, p)
			}
			st[i] = EndpointStatus{Provider: p.Name, Addr: e.Addr, UID: e.UID, Name: e.Name, State: state}
		}
		w.made = made
		live[name], x.endpoints[name] = ps, st
	}
	x.cfg, x.key = expandRoutes(base, live, x.endpoints)
	return x
}

// expandRoutes makes the expanded config of base from the live providers of each source.
func expandRoutes(base *config.Config, live map[string][]config.ProviderConfig, states map[string][]EndpointStatus) (*config.Config, string) {
	cfg := *base
	cfg.Routes = make([]config.RouteConfig, len(base.Routes))
	cfg.Providers = append([]config.ProviderConfig(nil), base.Providers...)
	added := map[string]bool{}
	var full []capped // live endpoints a full route had no room for
	var key strings.Builder
	for i, rc := range base.Routes {
		if !namesSource(&rc) {
			cfg.Routes[i] = rc
			continue
		}
		add := func(p *config.ProviderConfig) {
			if !added[p.Name] {
				added[p.Name] = true
				cfg.Providers = append(cfg.Providers, *p)
				writeKey(&key, p)
			}
		}
		rc.Targets, rc.Discovered = expandPool(rc.Targets, live, add, &full)
		if d := rc.Disaggregation; d != nil {
			dc := *d
			dc.Decode, dc.DecodeDiscovered = expandPool(d.Decode, live, add, &full)
			rc.Disaggregation = &dc
		}
		cfg.Routes[i] = rc
	}
	// An endpoint no route had room for is capped; one that another route took is live.
	for _, c := range full {
		if !added[c.provider] {
			capProvider(states[c.source], c.provider)
		}
	}
	return &cfg, key.String()
}

// capped is a live endpoint of source a route had no room for.
type capped struct{ source, provider string }

// expandPool returns pool with each target that names a source replaced by one per live endpoint of it, as
// many as the pool has room for (the others are appended to full), and the sources it named. add is called
// with the provider of every endpoint taken.
func expandPool(pool []config.TargetConfig, live map[string][]config.ProviderConfig, add func(*config.ProviderConfig), full *[]capped) ([]config.TargetConfig, []string) {
	room := config.MaxTargets - explicitTargets(pool)
	targets := make([]config.TargetConfig, 0, len(pool))
	var sources []string
	for _, t := range pool {
		if t.Source == "" {
			targets = append(targets, t)
			continue
		}
		sources = append(sources, t.Source)
		for i := range live[t.Source] {
			p := &live[t.Source][i]
			if room == 0 {
				*full = append(*full, capped{t.Source, p.Name})
				continue
			}
			room--
			targets = append(targets, config.TargetConfig{Provider: p.Name, Model: t.Model, Weight: t.Weight})
			add(p)
		}
	}
	return targets, sources
}

func namesSource(rc *config.RouteConfig) bool {
	has := func(pool []config.TargetConfig) bool {
		return slices.ContainsFunc(pool, func(t config.TargetConfig) bool { return t.Source != "" })
	}
	return has(rc.Targets) || rc.Disaggregation != nil && has(rc.Disaggregation.Decode)
}

func explicitTargets(pool []config.TargetConfig) int {
	n := 0
	for _, t := range pool {
		if t.Source == "" {
			n++
		}
	}
	return n
}

// capProvider marks the live endpoint of provider name capped: the route it would join is full.
func capProvider(st []EndpointStatus, name string) {
	for i := range st {
		if st[i].Provider == name && st[i].State == StateLive {
			st[i].State = StateCapped
		}
	}
}

func writeKey(b *strings.Builder, p *config.ProviderConfig) {
	b.WriteString(p.Name)
	b.WriteByte(0)
	if p.KVEvents != nil {
		b.WriteString(p.KVEvents.Endpoint)
	}
	b.WriteByte(0)
	if p.LMCache != nil {
		b.WriteString(p.LMCache.Endpoint)
	}
	b.WriteByte(0)
}

// EndpointStatus is one endpoint a source sees.
type EndpointStatus struct {
	Provider string         `json:"provider"`
	Addr     netip.AddrPort `json:"address"`
	UID      string         `json:"uid,omitempty"`
	Name     string         `json:"name,omitempty"`
	State    string         `json:"state"`
}
