package pressure

import (
	"fmt"
	"strconv"
	"strings"
)

// StrategySpec is one row of the report: a strategy and the route parameters it runs with.
type StrategySpec struct {
	// Label is the spec as given ("cache_aware:max_trie_bytes=1kv").
	Label    string
	Strategy string
	// Params are key = value pairs in the order given; a value "<f>kv" is f times one engine's KV
	// capacity in prompt-key bytes (ParamValue).
	Params [][2]string
}

// ParseStrategySpec parses "name" or "name:key=value,key=value".
func ParseStrategySpec(s string) (StrategySpec, error) {
	spec := StrategySpec{Label: s}
	name, params, ok := strings.Cut(s, ":")
	spec.Strategy = strings.TrimSpace(name)
	if spec.Strategy == "" {
		return spec, fmt.Errorf("cannot parse strategy %q: no name", s)
	}
	if !ok {
		return spec, nil
	}
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return spec, fmt.Errorf("cannot parse strategy %q: parameter %q is not key=value", s, kv)
		}
		if _, err := paramValue(v, 1, 16); err != nil {
			return spec, fmt.Errorf("cannot parse strategy %q: %w", s, err)
		}
		spec.Params = append(spec.Params, [2]string{k, v})
	}
	return spec, nil
}

// paramValue renders a parameter value as TOML: "<f>kv" becomes f × numBlocks × blockSize × 4, the bytes
// of prompt key one engine's KV cache holds (the workloads' words are 4 bytes a token: "abc "); a number or
// a boolean stays as it is.
func paramValue(v string, numBlocks, blockSize int) (string, error) {
	if f, ok := strings.CutSuffix(v, "kv"); ok {
		x, err := strconv.ParseFloat(f, 64)
		if err != nil || !(x > 0) {
			return "", fmt.Errorf("cannot use %q: want <positive number>kv", v)
		}
		return strconv.Itoa(int(x * float64(numBlocks*blockSize*4))), nil
	}
	if v == "true" || v == "false" {
		return v, nil
	}
	if _, err := strconv.ParseFloat(v, 64); err != nil {
		return "", fmt.Errorf("cannot use %q: want a number, a boolean or <number>kv", v)
	}
	return v, nil
}

// routeParams renders the spec's parameters as a [routes.params] table for an engine of numBlocks.
func (s StrategySpec) routeParams(numBlocks, blockSize int) string {
	if len(s.Params) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n[routes.params]\n")
	for _, kv := range s.Params {
		v, _ := paramValue(kv[1], numBlocks, blockSize) // checked by ParseStrategySpec
		fmt.Fprintf(&b, "%s = %s\n", kv[0], v)
	}
	return b.String()
}
