package config

import (
	"strings"
	"testing"
)

const loraBase = `
[[providers]]
name = "p"
api_base = "http://10.0.0.1:8000"
[[providers]]
name = "q"
api_base = "http://10.0.0.2:8000"
[[routes]]
model = "llama"
strategy = "cache_aware"
[[routes.targets]]
provider = "p"
model = "meta-llama/Llama-3.1-8B"
[[routes.targets]]
provider = "q"
model = "meta-llama/Llama-3.1-8B"
weight = 2
[routes.lora]
adapters = ["sql", "chat"]
[[routes]]
model = "other"
[[routes.targets]]
provider = "p"
`

// TestLoRAValidation: the defaults of [routes.lora], the routes it serves, and every rule under its key.
func TestLoRAValidation(t *testing.T) {
	cfg, err := Parse([]byte(loraBase), "l.toml")
	if err != nil {
		t.Fatal(err)
	}
	l := cfg.Routes[0].LoRA
	if *l.HomeReplicas != DefaultHomeReplicas || *l.MaxHomeReplicas != DefaultMaxHomeReplicas || *l.ReplicaRequests != DefaultReplicaRequests ||
		*l.CoolSecs != DefaultLoRACoolSecs || *l.LoadTimeoutSecs != DefaultLoRALoadSecs || l.DynamicLoRA {
		t.Fatalf("defaults not set: %+v", l)
	}
	served := cfg.ServedRoutes()
	if len(served) != 4 {
		t.Fatalf("served routes: %d, want llama, sql, chat, other", len(served))
	}
	sql := served[1]
	if sql.Model != "sql" || sql.LoRABase != "llama" || sql.LoRA != l || sql.Strategy != "cache_aware" || len(sql.Targets) != 2 ||
		sql.Targets[0].Model != "sql" || sql.Targets[1].Provider != "q" || *sql.Targets[1].Weight != 2 {
		t.Fatalf("adapter route: %+v %+v", sql, sql.Targets)
	}
	if cfg.Routes[0].Targets[0].Model != "meta-llama/Llama-3.1-8B" || served[0].LoRABase != "" || served[3].Model != "other" {
		t.Fatal("the base route changed")
	}
	dyn, err := Parse([]byte(strings.Replace(loraBase, "[routes.lora]\n", "[routes.lora]\ndynamic_lora = true\nadapter_path = \"/loras/{adapter}\"\n", 1)), "l.toml")
	if err != nil || dyn.Routes[0].LoRA.PathOf("sql") != "/loras/sql" {
		t.Fatalf("dynamic: %v", err)
	}
	f := func(src, want string) {
		t.Helper()
		_, err := Parse([]byte(src), "l.toml")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("got %v, want %q\n%s", err, want, src)
		}
	}
	r := func(old, new string) string { return strings.Replace(loraBase, old, new, 1) }
	f(r(`adapters = ["sql", "chat"]`, `adapters = []`), `routes[0].lora.adapters: route "llama" names no adapters`)
	f(r(`"chat"]`, `"sql"]`), `routes[0].lora.adapters[1]: adapter "sql" is listed twice`)
	f(r(`"chat"]`, `"llama"]`), `routes[0].lora.adapters[1]: adapter "llama" is the route's own model`)
	f(r(`"chat"]`, `"other"]`), `routes[0].lora.adapters[1]: adapter "other" is the model of routes[1]`)
	f(r(`"chat"]`, `"a,b"]`), `routes[0].lora.adapters[1]: adapter name "a,b" has a space`)
	f(r(`"chat"]`, `""]`), `routes[0].lora.adapters[1]: empty adapter name`)
	f(r(`"chat"]`, `"`+strings.Repeat("x", 300)+`"]`), `adapter name is 300 bytes`)
	f(r("[routes.lora]\n", "[routes.lora]\nhome_replicas = 0\n"), "routes[0].lora.home_replicas: home_replicas must be >= 1")
	f(r("[routes.lora]\n", "[routes.lora]\nhome_replicas = 3\nmax_home_replicas = 2\n"), "routes[0].lora.max_home_replicas: max_home_replicas (2) must be >= home_replicas (3)")
	f(r("[routes.lora]\n", "[routes.lora]\nmax_home_replicas = 65\n"), "max_home_replicas must be <= 64")
	f(r("[routes.lora]\n", "[routes.lora]\nreplica_requests = 0\n"), "routes[0].lora.replica_requests: replica_requests must be >= 1")
	f(r("[routes.lora]\n", "[routes.lora]\ncool_secs = 0\n"), "routes[0].lora.cool_secs: cool_secs must be > 0")
	f(r("[routes.lora]\n", "[routes.lora]\nload_timeout_secs = -1\n"), "routes[0].lora.load_timeout_secs: load_timeout_secs must be > 0")
	f(r("[routes.lora]\n", "[routes.lora]\ndynamic_lora = true\n"), `routes[0].lora.adapter_path: dynamic_lora needs adapter_path with "{adapter}"`)
	f(r("[routes.lora]\n", "[routes.lora]\nadapter_path = \"/x/{adapter}\"\n"), "routes[0].lora.adapter_path: adapter_path is used by dynamic_lora only")
	two := loraBase + "[routes.lora]\nadapters = [\"sql\"]\n"
	f(two, `routes[1].lora.adapters[0]: adapter "sql" is also an adapter of routes[0]`)
}
