package sim

import (
	"errors"
	"flag"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	cfg, err := ParseFlags([]string{
		"--port", "0", "-kv-events", "tcp://*:5557", "--replay", "tcp://*:5558", "--kv-era", "positional",
		"--block-size", "32", "--num-blocks", "100", "--max-num-seqs", "4", "--prefill-us-per-token", "2.5",
		"--decode-us-per-token", "1500", "--model", "m", "--error-rate", "0.25", "--added-latency-ms", "7",
		"--hang", "--abort-after-chunks", "3", "--drop-every-nth-batch", "5", "--garbage-every-n-batches", "6",
		"--hash-mode", "bytes", "--replay-layout", "old", "--topic", "kv", "--max-tokens", "9",
		"--role", "prefill", "--engine-id", "p0", "--side-channel-port", "5700", "--kv-lease-seconds", "2.5",
		"--transfer-us-per-block", "5", "--kv-load-failure-policy", "recompute",
		"--bootstrap-timeout-seconds", "1.5", "--waiting-timeout-seconds", "2",
		"--enable-lora", "--max-loras", "2", "--lora-modules", "a=/p/a,b=/p/b c=/p/c", "--lora-modules", `{"name": "d", "path": "/p/d"}`,
		"--lora-load-ms", "30", "--allow-runtime-lora",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Host: "127.0.0.1", Port: 0, Model: "m", EngineLabel: "0",
		KVEvents: "tcp://*:5557", Replay: "tcp://*:5558", Topic: "kv", Era: EraPositional,
		HashMode: HashBytes, ReplayLayout: ReplayOld, ReplayBuffer: 10000, BatchWindow: 2 * time.Millisecond,
		BlockSize: 32, NumBlocks: 100, MaxNumSeqs: 4, MaxModelLen: 3200, MaxTokens: 9,
		PrefillPerToken: 2500 * time.Nanosecond, DecodePerToken: 1500 * time.Microsecond, IdleTimeout: 5 * time.Second,
		Role: RolePrefill, EngineID: "p0", SideChannelPort: 5700, SideChannelHost: "127.0.0.1",
		KVLease: 2500 * time.Millisecond, TransferPerBlock: 5 * time.Microsecond, KVLoadFailure: LoadRecompute,
		BootstrapTimeout: 1500 * time.Millisecond, WaitingTimeout: 2 * time.Second,
		Faults: Faults{ErrorRate: 0.25, AddedLatency: 7 * time.Millisecond, HangBeforeHeaders: true,
			AbortAfterChunks: 3, DropEveryNthBatch: 5, GarbageEveryNBatches: 6},
		EnableLoRA: true, MaxLoRAs: 2, MaxCPULoRAs: 2, LoRALoadDelay: 30 * time.Millisecond, AllowRuntimeLoRA: true,
		LoRAModules: []LoRAModule{{"a", "/p/a"}, {"b", "/p/b"}, {"c", "/p/c"}, {"d", "/p/d"}},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got  %+v\nwant %+v", cfg, want)
	}

	def, err := ParseFlags(nil)
	if err != nil || def.Port != 8000 || def.KVEvents != "" || def.Era != EraMap || def.PrefillPerToken != 20*time.Microsecond ||
		def.Role != RoleAggregated || def.SideChannelPort != 5600 || def.KVLease != 480*time.Second || def.KVLoadFailure != LoadFail ||
		def.BootstrapTimeout != 300*time.Second || def.WaitingTimeout != 300*time.Second ||
		def.EnableLoRA || def.MaxLoRAs != 1 || def.MaxCPULoRAs != 1 || def.LoRALoadDelay != 100*time.Millisecond || def.AllowRuntimeLoRA {
		t.Fatalf("defaults %+v %v", def, err)
	}
	if _, err := ParseFlags([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
}

func TestParseFlagsRuntimeLoRAEnv(t *testing.T) {
	f := func(env string, want bool) {
		t.Helper()
		t.Setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", env)
		cfg, err := ParseFlags([]string{"--enable-lora"})
		if err != nil || cfg.AllowRuntimeLoRA != want {
			t.Fatalf("VLLM_ALLOW_RUNTIME_LORA_UPDATING=%q: runtime updating %v, want %v (%v)", env, cfg.AllowRuntimeLoRA, want, err)
		}
	}
	f("True", true)
	f("1", true)
	f("0", false)
	f("", false)
	t.Setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "1")
	if cfg, err := ParseFlags(nil); err != nil || cfg.AllowRuntimeLoRA {
		t.Fatalf("without --enable-lora: runtime updating %v (%v)", cfg.AllowRuntimeLoRA, err)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	f := func(args string, wantErrs ...string) {
		t.Helper()
		_, err := ParseFlags(strings.Fields(args))
		if err == nil {
			t.Fatalf("%q: no error", args)
		}
		for _, w := range wantErrs {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%q: error %q lacks %q", args, err, w)
			}
		}
	}
	// Every problem is reported at once.
	f("--kv-era bogus --error-rate 2 --hash-mode x", `kv event era "bogus"`, "error rate 2", `hash mode "x"`)
	f("--replay tcp://*:5558", "needs a kv events endpoint")
	f("--replay-layout sideways", `replay layout "sideways"`)
	f("--role pd --kv-load-failure-policy retry --side-channel-port 70000 --kv-lease-seconds 0",
		`unknown role "pd"`, `kv load failure policy "retry"`, "side channel port 70000", "kv-lease-seconds 0")
	f("--num-blocks 4 --block-size 16 --max-tokens 64", "max tokens 64 must be below max model len 64")
	f("--max-model-len 99999", "max model len 99999 out of range")
	f("--prefill-us-per-token -1", "must not be negative")
	f("--port 70000", "port 70000")
	f("--waiting-timeout-seconds 0 --bootstrap-timeout-seconds -1", "bootstrap or waiting timeout of 0", "bootstrap-timeout-seconds -1")
	f("stray", `unexpected argument "stray"`)
	f("--unknown-flag", "flag provided but not defined")
	f("--lora-modules a=/p", "need enable-lora")
	f("--enable-lora --lora-modules a", `lora module "a": want name=path`)
	f("--enable-lora --lora-modules a=/p,a=/q --max-loras 4 --max-cpu-loras 2 --lora-load-ms -1",
		`lora module "a" given twice`, "max cpu loras 2 must be at least max loras 4", "lora-load-ms -1")
	f("--enable-lora --lora-modules sim-model=/p", "base model's name")
}

func TestNewRejectsBadConfig(t *testing.T) {
	if _, err := New(Config{MaxNumSeqs: -1}); err == nil || !strings.Contains(err.Error(), "cannot configure sim engine") {
		t.Fatalf("New: %v", err)
	}
	e, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := e.Config()
	if c.Model != "sim-model" || c.BlockSize != 16 || c.NumBlocks != 2048 || c.MaxNumSeqs != 8 || c.MaxTokens != 16 ||
		c.MaxModelLen != 32768 || c.PrefillPerToken != 0 || c.Host != "127.0.0.1" {
		t.Fatalf("normalized %+v", c)
	}
	e.Stop() // before Start: a no-op
	if err := e.Start(); err == nil {
		e.Stop()
		t.Fatalf("Start after Stop succeeded")
	}
}
