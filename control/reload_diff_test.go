//go:build cgo

package control

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/internal/freeport"
)

// apiObjects are an org's providers (by name) and routes (by model), as the API takes them.
type apiObjects struct {
	providers map[string]*config.ProviderConfig
	routes    map[string]*config.RouteConfig
}

func (o apiObjects) clone(t *testing.T) apiObjects {
	t.Helper()
	c := apiObjects{map[string]*config.ProviderConfig{}, map[string]*config.RouteConfig{}}
	for n, p := range o.providers {
		var q config.ProviderConfig
		roundTrip(t, p, &q)
		c.providers[n] = &q
	}
	for n, r := range o.routes {
		var q config.RouteConfig
		roundTrip(t, r, &q)
		c.routes[n] = &q
	}
	return c
}

func roundTrip(t *testing.T, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		t.Fatal(err)
	}
}

func loopbackPort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// apiBase is the differential test's org: providers with every field set (kv_events in both modes,
// lmcache, headers, an API key), and routes over every strategy with parameters and a shadow.
func apiBase(e *env, connect, bind int) apiObjects {
	w := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	b := func(v bool) *bool { return &v }
	return apiObjects{
		providers: map[string]*config.ProviderConfig{
			"p": {Name: "p", APIBase: e.A.URL + "/v1", APIKeyEnv: "ROLTER_API_DIFF_KEY", Headers: map[string]string{"X-Team": "t1"},
				MaxConns: 64, KVEvents: &config.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", connect), Topic: "kv@p",
					MaxBlocks: 1000, StaleSecs: 30},
				LMCache: &config.LMCacheConfig{Endpoint: e.A.URL + "/lmcache", RefreshSecs: 30, StaleSecs: 60}},
			"q": {Name: "q", APIBase: e.B.URL, KVEvents: &config.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", bind),
				Mode: "bind", Topic: "kv@q", AllowedPublishers: []string{"127.0.0.1"}}},
			"d": {Name: "d", APIBase: e.B.URL + "/d"},
		},
		routes: map[string]*config.RouteConfig{
			"m": {Model: "m", Strategy: "precise_cache_aware", Params: config.RouteParams{Threshold: w(0.5), MaxTrieNodes: i(1000),
				MaxTrieBytes: i(100000), StaleGap: w(0.4), StaleWindow: i(50), Home: b(true)},
				Shadow:  &config.ShadowConfig{Strategies: []string{"cache_aware"}},
				Targets: []config.TargetConfig{{Provider: "p", Model: "up-p"}, {Provider: "q", Model: "up-q"}}},
			"c": {Model: "c", Strategy: "cache_aware", Params: config.RouteParams{OverloadMargin: w(2), OverloadFactor: w(1.5)},
				Targets: []config.TargetConfig{{Provider: "p"}, {Provider: "q"}}},
			"pl": {Model: "pl", Strategy: "pipeline", Params: config.RouteParams{WeightFactor: w(1), LoadFactor: w(1), CacheFactor: w(1),
				SessionTTLSecs: w(60), MaxSessions: i(100), HotWindow: i(64)},
				Targets: []config.TargetConfig{{Provider: "p", Weight: w(1)}, {Provider: "q", Weight: w(2)}}},
			"h": {Model: "h", Strategy: "consistent_hash", Params: config.RouteParams{Epsilon: w(0.25), VirtualNodes: i(40), KeyBytes: i(256)},
				Targets: []config.TargetConfig{{Provider: "p"}, {Provider: "q"}}},
			"rr": {Model: "rr", Strategy: "round_robin", Targets: []config.TargetConfig{{Provider: "d"}}},
		},
	}
}

// objectPaths lists the JSON field paths of an API object's type: nested objects (behind pointers, in
// arrays) are a path themselves and the parent of their fields'. Fields the API does not take (json "-")
// are left out.
func objectPaths(t reflect.Type) []string {
	var out []string
	var walk func(prefix string, t reflect.Type)
	walk = func(prefix string, t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			path := strings.TrimPrefix(prefix+"."+name, ".")
			ft := f.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if ft != f.Type {
					out = append(out, path)
				}
				walk(path, ft)
				continue
			}
			out = append(out, path)
		}
	}
	walk("", t)
	return out
}

// apiMutations are one valid change per field path of provider and route objects.
func apiMutations(t *testing.T, e *env, connect2, bind2 int) map[string]func(o apiObjects) {
	curvePublic, curveSecret, err := zmq.NewCurveKeypair()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("ROLTER_API_DIFF_CURVE", curveSecret)
	w := func(v float64) *float64 { return &v }
	i := func(v int) *int { return &v }
	b := func(v bool) *bool { return &v }
	return map[string]func(o apiObjects){
		"provider.name": func(o apiObjects) {
			d := o.providers["d"]
			delete(o.providers, "d")
			d.Name = "d2"
			o.providers["d2"] = d
			o.routes["rr"].Targets[0].Provider = "d2"
		},
		"provider.kind":           func(o apiObjects) { o.providers["d"].Kind = "openai_compatible" }, // the default, explicit
		"provider.api_base":       func(o apiObjects) { o.providers["p"].APIBase = e.B.URL + "/v2" },
		"provider.api_key_env":    func(o apiObjects) { o.providers["p"].APIKeyEnv = "ROLTER_API_DIFF_KEY2" },
		"provider.headers":        func(o apiObjects) { o.providers["p"].Headers = map[string]string{"X-Team": "t2"} },
		"provider.api_key_secret": func(o apiObjects) { o.providers["d"].APIKeySecret = "s1" },
		"provider.header_secrets": func(o apiObjects) { o.providers["d"].HeaderSecrets = map[string]string{"X-Org": "s2"} },
		"provider.max_conns":      func(o apiObjects) { o.providers["p"].MaxConns = 65 },
		"provider.kv_events": func(o apiObjects) {
			// A source added to a provider that had none, and its route switched to precise_cache_aware.
			o.providers["d"].KVEvents = &config.KVEventsConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", connect2)}
			o.routes["rr"].Strategy = "precise_cache_aware"
		},
		"provider.kv_events.endpoint": func(o apiObjects) {
			o.providers["p"].KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", connect2)
		},
		"provider.kv_events.topic": func(o apiObjects) { o.providers["p"].KVEvents.Topic = "kv@p2" },
		"provider.kv_events.replay_endpoint": func(o apiObjects) {
			o.providers["p"].KVEvents.ReplayEndpoint = fmt.Sprintf("tcp://127.0.0.1:%d", bind2)
		},
		"provider.kv_events.mode": func(o apiObjects) {
			o.providers["p"].KVEvents.Mode = "bind"
			o.providers["p"].KVEvents.Endpoint = fmt.Sprintf("tcp://127.0.0.1:%d", bind2)
		},
		"provider.kv_events.max_blocks": func(o apiObjects) { o.providers["p"].KVEvents.MaxBlocks = 2000 },
		"provider.kv_events.stale_secs": func(o apiObjects) { o.providers["p"].KVEvents.StaleSecs = 31 },
		"provider.kv_events.allowed_publishers": func(o apiObjects) {
			o.providers["q"].KVEvents.AllowedPublishers = []string{"127.0.0.0/8"}
		},
		"provider.kv_events.curve_secret_key_env": func(o apiObjects) {
			o.providers["q"].KVEvents.CurveSecretKeyEnv = "ROLTER_API_DIFF_CURVE"
			o.providers["q"].KVEvents.CurveClientKeys = []string{curvePublic}
		},
		"provider.kv_events.curve_client_keys": func(o apiObjects) {
			o.providers["q"].KVEvents.CurveSecretKeyEnv = "ROLTER_API_DIFF_CURVE"
			o.providers["q"].KVEvents.CurveClientKeys = []string{curvePublic, curvePublic[:39] + "a"}
		},
		"provider.lmcache":              func(o apiObjects) { o.providers["q"].LMCache = &config.LMCacheConfig{Endpoint: e.B.URL + "/lmcache"} },
		"provider.lmcache.endpoint":     func(o apiObjects) { o.providers["p"].LMCache.Endpoint = e.A.URL + "/lmcache/v2" },
		"provider.lmcache.refresh_secs": func(o apiObjects) { o.providers["p"].LMCache.RefreshSecs = 31 },
		"provider.lmcache.stale_secs":   func(o apiObjects) { o.providers["p"].LMCache.StaleSecs = 61 },

		"route.model": func(o apiObjects) {
			r := o.routes["c"]
			delete(o.routes, "c")
			r.Model = "c2"
			o.routes["c2"] = r
		},
		"route.strategy":                func(o apiObjects) { o.routes["h"].Strategy = "least_load"; o.routes["h"].Params = config.RouteParams{} },
		"route.targets":                 func(o apiObjects) { o.routes["m"].Targets = o.routes["m"].Targets[:1] },
		"route.targets.provider":        func(o apiObjects) { o.routes["c"].Targets[1].Provider = "d" },
		"route.targets.model":           func(o apiObjects) { o.routes["m"].Targets[0].Model = "up-p2" },
		"route.targets.weight":          func(o apiObjects) { o.routes["pl"].Targets[1].Weight = w(3) },
		"route.params.threshold":        func(o apiObjects) { o.routes["m"].Params.Threshold = w(0.6) },
		"route.params.max_trie_nodes":   func(o apiObjects) { o.routes["m"].Params.MaxTrieNodes = i(2000) },
		"route.params.max_trie_bytes":   func(o apiObjects) { o.routes["m"].Params.MaxTrieBytes = i(200000) },
		"route.params.session_ttl_secs": func(o apiObjects) { o.routes["pl"].Params.SessionTTLSecs = w(61) },
		"route.params.max_sessions":     func(o apiObjects) { o.routes["pl"].Params.MaxSessions = i(101) },
		"route.params.epsilon":          func(o apiObjects) { o.routes["h"].Params.Epsilon = w(0.3) },
		"route.params.virtual_nodes":    func(o apiObjects) { o.routes["h"].Params.VirtualNodes = i(41) },
		"route.params.key_bytes":        func(o apiObjects) { o.routes["h"].Params.KeyBytes = i(257) },
		"route.params.weight_factor":    func(o apiObjects) { o.routes["pl"].Params.WeightFactor = w(2) },
		"route.params.load_factor":      func(o apiObjects) { o.routes["pl"].Params.LoadFactor = w(2) },
		"route.params.cache_factor":     func(o apiObjects) { o.routes["pl"].Params.CacheFactor = w(2) },
		"route.params.stale_gap":        func(o apiObjects) { o.routes["m"].Params.StaleGap = w(0.5) },
		"route.params.stale_window":     func(o apiObjects) { o.routes["m"].Params.StaleWindow = i(51) },
		"route.params.home":             func(o apiObjects) { o.routes["m"].Params.Home = b(false) },
		"route.params.overload_margin":  func(o apiObjects) { o.routes["c"].Params.OverloadMargin = w(3) },
		"route.params.overload_factor":  func(o apiObjects) { o.routes["c"].Params.OverloadFactor = w(2) },
		"route.params.hot_window":       func(o apiObjects) { o.routes["pl"].Params.HotWindow = i(128) },
		"route.params.load_bound":       func(o apiObjects) { o.routes["pl"].Params.LoadBound = w(0.5) },
		"route.shadow": func(o apiObjects) {
			o.routes["c"].Shadow = &config.ShadowConfig{Strategies: []string{"pipeline", "precise_cache_aware"}}
		},
		"route.shadow.strategies": func(o apiObjects) { o.routes["m"].Shadow.Strategies = []string{"cache_aware", "pipeline"} },
	}
}

// apiOp is one write of the objects' difference.
type apiOp struct {
	method, path string
	body         any
}

// syncObjects writes what differs between from and to through the API. A write the gateway cannot take
// yet (a route onto a source not added yet, a source removed before its route moved off it) is tried again
// after the others.
func syncObjects(t *testing.T, e *env, org string, from, to apiObjects) {
	t.Helper()
	base := "/api/v1/orgs/" + org
	var ops []apiOp
	for n, p := range to.providers {
		if !reflect.DeepEqual(from.providers[n], p) {
			ops = append(ops, apiOp{"PUT", base + "/providers/" + url.PathEscape(n), p})
		}
	}
	for n, r := range to.routes {
		if !reflect.DeepEqual(from.routes[n], r) {
			ops = append(ops, apiOp{"PUT", base + "/routes/" + url.PathEscape(n), r})
		}
	}
	for n := range from.routes {
		if to.routes[n] == nil {
			ops = append(ops, apiOp{"DELETE", base + "/routes/" + url.PathEscape(n), nil})
		}
	}
	for n := range from.providers {
		if to.providers[n] == nil {
			ops = append(ops, apiOp{"DELETE", base + "/providers/" + url.PathEscape(n), nil})
		}
	}
	for len(ops) > 0 {
		var left []apiOp
		var last apiResp
		for _, op := range ops {
			if r := e.su(op.method, op.path, op.body); r.status >= 300 {
				left, last = append(left, op), r
			}
		}
		if len(left) == len(ops) {
			t.Fatalf("cannot write %s %s: %d %s", left[0].method, left[0].path, last.status, last.body)
		}
		ops = left
	}
}

// apiCloser shuts gateways down in the background (a KV-event subscriber takes a quarter of a second).
type apiCloser struct {
	wg sync.WaitGroup
}

func (c *apiCloser) close(g *engine.Gateway) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	}()
}

// freshBuilt is what a gateway started on the file and the store as they are now builds.
func freshBuilt(t *testing.T, e *env, c *apiCloser) string {
	t.Helper()
	st, err := e.store.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := Compose(e.file.Load(), st)
	if err != nil {
		t.Fatal(err)
	}
	// The fresh gateway runs beside the live one, and a bind on a port another gateway holds is refused: its
	// bind-mode sources bind ports of their own (allowed in its [egress] kv_bind_ports in place of the
	// store's), written back as the store's in its description.
	var back []string
	ports := slices.Clone(cfg.Egress.KVBindPorts)
	for i := range cfg.Providers {
		kv := cfg.Providers[i].KVEvents
		if kv == nil || kv.Mode != "bind" {
			continue
		}
		own := loopbackPort(t)
		for taken, _ := json.Marshal(cfg); strings.Contains(string(taken), fmt.Sprintf(":%d", own)); {
			own = loopbackPort(t) // a port of its own, so that only the binds are written back
		}
		old, err := strconv.Atoi(kv.Endpoint[strings.LastIndexByte(kv.Endpoint, ':')+1:])
		if err != nil {
			t.Fatal(err)
		}
		if k := slices.Index(ports, old); k >= 0 {
			ports[k] = own
		}
		ownEndpoint := fmt.Sprintf("tcp://127.0.0.1:%d", own)
		back = append(back, ownEndpoint, kv.Endpoint)
		kv.Endpoint = ownEndpoint
	}
	ownJSON, _ := json.Marshal(ports)
	storeJSON, _ := json.Marshal(cfg.Egress.KVBindPorts)
	back = append(back, fmt.Sprintf("KVBindPorts:%v", ports), fmt.Sprintf("KVBindPorts:%v", cfg.Egress.KVBindPorts),
		`"kv_bind_ports":`+string(ownJSON), `"kv_bind_ports":`+string(storeJSON))
	cfg.Egress.KVBindPorts = ports
	if errs := config.Validate(cfg); len(errs) > 0 {
		t.Fatalf("the store does not validate: %s", errs)
	}
	g, err := engine.New(cfg, engine.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Resolver: fakeDNS{"kv.test": "169.254.169.254"}})
	if err != nil {
		t.Fatalf("a fresh gateway on the store: %s", err)
	}
	defer c.close(g)
	return strings.NewReplacer(back...).Replace(g.Built())
}

// wantFresh fails unless the live gateway is built as a fresh one on the same file and store.
func wantFresh(t *testing.T, e *env, c *apiCloser, what string) string {
	t.Helper()
	live, fresh := e.gw.Built(), freshBuilt(t, e, c)
	if live != fresh {
		t.Fatalf("after %s, the gateway is not built as one started on the same store (- live, + fresh):\n%s",
			what, builtDiff(live, fresh))
	}
	return live
}

func builtDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAPIReloadDifferential: every field of provider and route objects, changed through the API one at a
// time (and changed back), and data-plane keys made and revoked, leave the gateway built exactly as a
// gateway started on the same file and store - nothing the reload carried over keeps an old setting.
func TestAPIReloadDifferential(t *testing.T) {
	connect, bind, connect2, bind2 := loopbackPort(t), loopbackPort(t), loopbackPort(t), loopbackPort(t)
	// The operator lets orgs read the test's variables and bind the test's ports, and keeps secrets.
	e := newEnvWith(t, filepath.Join(t.TempDir(), "rolter.db"), fmt.Sprintf(`[control]
enabled = true
provider_env = ["ROLTER_API_DIFF_KEY", "ROLTER_API_DIFF_KEY2", "ROLTER_API_DIFF_CURVE"]
[egress]
kv_bind_ports = [%d, %d]
`, bind, bind2), testSecretsKey(t))
	org := e.mkOrg("a")
	t.Setenv("ROLTER_API_DIFF_KEY", "secret one")
	t.Setenv("ROLTER_API_DIFF_KEY2", "secret two")
	for name, value := range map[string]string{"s1": "org secret one", "s2": "org secret two"} {
		want(t, e.su("PUT", "/api/v1/orgs/"+org+"/secrets/"+name, map[string]string{"value": value}), 201, "")
	}
	muts := apiMutations(t, e, connect2, bind2)
	c := &apiCloser{}
	defer c.wg.Wait()
	empty := apiObjects{map[string]*config.ProviderConfig{}, map[string]*config.RouteConfig{}}
	base := apiBase(e, connect, bind)
	syncObjects(t, e, org, empty, base)
	before := wantFresh(t, e, c, "the base objects")

	paths := append(prefixed("provider.", objectPaths(reflect.TypeFor[config.ProviderConfig]())),
		prefixed("route.", objectPaths(reflect.TypeFor[config.RouteConfig]()))...)
	for path := range muts {
		if !slices.Contains(paths, path) {
			t.Errorf("the mutation for %s names no field of a provider or route", path)
		}
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			mut := muts[path]
			if mut == nil {
				t.Fatalf("add a mutation for %s", path)
			}
			next := base.clone(t)
			mut(next)
			syncObjects(t, e, org, base, next)
			if after := wantFresh(t, e, c, "a change of "+path); after == before && path != "provider.kind" {
				t.Fatalf("changing %s changed nothing the gateway describes", path)
			}
			syncObjects(t, e, org, next, base)
			wantFresh(t, e, c, "changing "+path+" back")
		})
	}
	t.Run("secrets", func(t *testing.T) {
		// A provider that sends a secret is built anew when the secret's value changes.
		next := base.clone(t)
		next.providers["d"].APIKeySecret = "s1"
		syncObjects(t, e, org, base, next)
		using := wantFresh(t, e, c, "a provider using a secret")
		want(t, e.su("PUT", "/api/v1/orgs/"+org+"/secrets/s1", map[string]string{"value": "org secret three"}), 200, "")
		if wantFresh(t, e, c, "a new value of the secret") == using {
			t.Fatal("a new value of a secret in use changed nothing the gateway describes")
		}
		syncObjects(t, e, org, next, base)
		wantFresh(t, e, c, "the provider back to no secret")
	})
	t.Run("keys", func(t *testing.T) {
		_, id := e.mkKey(org, rootToken)
		if wantFresh(t, e, c, "a key made") == before {
			t.Fatal("a new data-plane key changed nothing the gateway describes")
		}
		want(t, e.su("DELETE", "/api/v1/orgs/"+org+"/keys/"+id, nil), 204, "")
		if wantFresh(t, e, c, "a key revoked") != before {
			t.Fatal("the gateway does not describe as before once the key is revoked")
		}
	})
}

func prefixed(prefix string, paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = prefix + p
	}
	return out
}
