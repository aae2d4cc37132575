package engine

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rolter-ai/rolter/sim"
)

// pdFleet starts nPrefill simulated prefill engines and nDecode decode engines (vLLM's NixlConnector
// roles) and returns them with the config of a gateway whose route "m" is disaggregated over them:
// strategy over the prefill pool p0.., decode pool d0.., and extra appended to [routes.disaggregation].
func pdFleet(t *testing.T, nPrefill, nDecode int, strategy, extra string, tweak func(*sim.Config)) (prefill, decode []*sim.Engine, cfg string) {
	t.Helper()
	role := func(r sim.Role) func(*sim.Config) {
		return func(c *sim.Config) {
			c.Role, c.SideChannelPort, c.SideChannelHost = r, 0, "127.0.0.1"
			c.EngineID = fmt.Sprintf("%s-%d", r, time.Now().UnixNano())
			c.TransferPerBlock, c.Model = 0, "up-model"
			if tweak != nil {
				tweak(c)
			}
		}
	}
	prefill, pu := simFleet(t, nPrefill, role(sim.RolePrefill))
	decode, du := simFleet(t, nDecode, role(sim.RoleDecode))
	return prefill, decode, pdConfig(pu, du, "up-model", "up-model", strategy, extra, "")
}

// longPrompt is a prompt well over the default prefill threshold.
func longPrompt(tag string) string {
	return tag + " " + strings.Repeat("the quick brown fox jumps over the lazy dog. ", 60)
}

func TestDisaggChat(t *testing.T) {
	prefill, decode, cfg := pdFleet(t, 2, 2, "cache_aware", "", nil)
	gw := startGateway(t, cfg)
	for _, stream := range []bool{false, true} {
		body := chatBody("m", longPrompt("hello"), stream)
		if stream {
			body = strings.Replace(body, `"stream":true`, `"stream":true,"stream_options":{"include_usage":true}`, 1)
		}
		resp, out := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%v: %d %s", stream, resp.StatusCode, out)
		}
		pt, dt := resp.Header.Get("X-Rolter-Prefill-Target"), resp.Header.Get("X-Rolter-Target")
		if !strings.HasPrefix(pt, "p") || !strings.HasPrefix(dt, "d") {
			t.Fatalf("stream=%v: prefill target %q, decode target %q", stream, pt, dt)
		}
		if stream && !strings.Contains(out, "data: [DONE]") {
			t.Fatalf("stream without [DONE]: %s", out)
		}
	}
	var remote, received uint64
	for _, e := range decode {
		s := e.Stats()
		remote += s.RemoteDecodes
		received += s.BlocksReceived
	}
	var prefilled uint64
	for _, e := range prefill {
		prefilled += e.Stats().RemotePrefills
	}
	if prefilled != 2 || remote != 2 || received == 0 {
		t.Fatalf("prefills %d, remote decodes %d, blocks received %d; want 2, 2, > 0", prefilled, remote, received)
	}
}

// TestDisaggCachedTokens: the client's usage says what the prefill engine reused, not the decode engine's
// count of the blocks it received.
func TestDisaggCachedTokens(t *testing.T) {
	_, _, cfg := pdFleet(t, 1, 1, "cache_aware", "", nil)
	gw := startGateway(t, cfg)
	body := chatBody("m", longPrompt("cached"), false)
	var cached []int
	for range 2 {
		resp, out := post(t, gw.URL+"/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		var a struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			}
		}
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("%s: %s", err, out)
		}
		cached = append(cached, a.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] == 0 {
		t.Fatalf("cached_tokens of a cold then a warm prompt: %v; want 0 then > 0", cached)
	}
}

// TestDisaggNodeSDK streams through a disaggregated route of simulated prefill and decode engines with the
// official OpenAI Node SDK (sdk.mjs): every request goes through both hops.
func TestDisaggNodeSDK(t *testing.T) {
	prefill, decode, cfg := pdFleet(t, 2, 2, "cache_aware", "prefill_threshold_tokens = 0", nil)
	up := newFakeUpstream(t, openAIUpstream)
	cfg += fmt.Sprintf("[[providers]]\nname = \"x\"\napi_base = %q\n[[routes]]\nmodel = \"dying\"\n[[routes.targets]]\nprovider = \"x\"\nmodel = \"dying\"\n", up.URL)
	res, out := runNodeSDK(t, startGateway(t, cfg).URL)
	if res.Chat == "" || !strings.HasPrefix(res.Target, "d") || res.StreamText == "" || res.Usage.Total_tokens == 0 ||
		res.NotFound.Status != 404 || res.MidStream.Name == "" {
		t.Fatalf("unexpected SDK results: %s", out)
	}
	var prefilled, decoded uint64
	for _, e := range prefill {
		prefilled += e.Stats().RemotePrefills
	}
	for _, e := range decode {
		decoded += e.Stats().RemoteDecodes
	}
	if prefilled != 3 || decoded != 3 {
		t.Fatalf("prefills %d, remote decodes %d; want 3 and 3 (the SDK's three requests to m)", prefilled, decoded)
	}
}
