package config

import (
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// TestExplicitTrieCeilingsFitTheBudget: a route's own max_trie_bytes / max_trie_nodes, every target
// counted, fit server.routing_memory_bytes with the other routes', and an org's fit its quota; the route
// that goes over is refused as a quota problem, and the routes without ceilings share what is left.
func TestExplicitTrieCeilingsFitTheBudget(t *testing.T) {
	f := func(params, org string, wantErr string) {
		t.Helper()
		text := gatewayConfig("cache_aware", "", "http://127.0.0.1:1", "http://127.0.0.1:2")
		text += "[[routes]]\nmodel = \"other\"\nstrategy = \"cache_aware\"\n[[routes.targets]]\nprovider = \"p0\"\n"
		cfg, err := Parse([]byte(text), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		// Set after parsing, as the control plane composes an org's route.
		if _, err := toml.Decode(params, &cfg.Routes[0].Params); err != nil {
			t.Fatal(err)
		}
		cfg.Routes[0].Org, cfg.File = org, ""
		errs := Validate(cfg)
		if wantErr == "" {
			if len(errs) > 0 {
				t.Fatalf("%q: %s", params, errs)
			}
			return
		}
		if len(errs) != 1 || !errs[0].Quota || !strings.Contains(errs[0].Error(), wantErr) {
			t.Fatalf("%q org %q: got %v, want one quota problem with %q", params, org, errs, wantErr)
		}
	}
	f("max_trie_bytes = 1099511627776", "", "routes[0].params.max_trie_bytes: the trie ceilings of route \"m\" take 5497558138880 bytes of routing memory (2 targets)")
	f("max_trie_bytes = 1099511627776", "org_a", "over server.routing_memory_bytes (536870912)")
	f("max_trie_nodes = 9223372036854775807", "", "over server.routing_memory_bytes")
	f("max_trie_bytes = 104857600", "", "") // 2 x 250 MiB of 512 MiB
	f("max_trie_bytes = 104857600", "org_a", "over the org's quota ([control.quotas] routing_memory_bytes, 67108864)")
	f("max_trie_bytes = 8388608", "org_a", "")     // 2 x 20 MiB of the org's 64 MiB
	f("max_trie_nodes = 131072", "org_a", "")      // 2 x 16 MiB
	f("max_trie_nodes = 524288", "org_a", "quota") // 2 x 64 MiB

	// What the ceilings take is not shared out again: route "other" gets the rest.
	text := gatewayConfig("cache_aware", "[routes.params]\nmax_trie_bytes = 104857600\n", "http://127.0.0.1:1", "http://127.0.0.1:2")
	text += "[[routes]]\nmodel = \"other\"\nstrategy = \"cache_aware\"\n[[routes.targets]]\nprovider = \"p0\"\n"
	cfg, err := Parse([]byte(text), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	// Route "m" sets max_trie_bytes only: its two targets take the share's node ceiling, so three share.
	if _, bytes := cfg.TrieShare(); bytes != (512<<20-2*262144000)/3*2/5 {
		t.Fatalf("the share is %d bytes", bytes)
	}
}
