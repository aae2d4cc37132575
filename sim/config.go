package sim

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Era selects the KV-event encoding of one vLLM generation (docs/internals/vllm-kv-events.md).
//
// The zero value is EraMap, the newest format.
type Era int

// Eras, newest first. The numbers in parentheses are the element counts of the positional
// BlockStored / BlockRemoved arrays, tag included.
const (
	// EraMap: tagged maps (vllm-project/vllm#42892, v0.26): BlockStored with 11 keys
	// (extra_keys [nil…], group_idx 0, kv_cache_spec_kind "full_attention"), BlockRemoved with 4.
	EraMap Era = iota
	// EraMapMinimal: tagged maps without the optional keys (BlockStored 8 keys, BlockRemoved 3).
	EraMapMinimal
	// EraPositional: the last positional era, after #40984 (12 / 4).
	EraPositional
	// EraGroupIdx: positional after #37688 (10 / 4).
	EraGroupIdx
	// EraExtraKeys: positional after #33304 (9 / 3).
	EraExtraKeys
	// EraLoraName: positional after #27577 (8 / 3).
	EraLoraName
	// EraMedium: positional after #19737 (7 / 3).
	EraMedium
	// EraDPRank: positional after #18925, the batch gains data_parallel_rank (6 / 2).
	EraDPRank
	// EraV08: the first format, #16750, v0.8.5: batch [ts, events] (6 / 2).
	EraV08
	eraCount
)

var eraNames = [eraCount]string{
	EraMap:        "map",
	EraMapMinimal: "map-minimal",
	EraPositional: "positional",
	EraGroupIdx:   "group-idx",
	EraExtraKeys:  "extra-keys",
	EraLoraName:   "lora-name",
	EraMedium:     "medium",
	EraDPRank:     "dp-rank",
	EraV08:        "v0.8",
}

// String returns the flag name of the era.
func (e Era) String() string {
	if e < 0 || e >= eraCount {
		return fmt.Sprintf("Era(%d)", int(e))
	}
	return eraNames[e]
}

// ParseEra returns the era with the given flag name.
func ParseEra(s string) (Era, error) {
	for i, name := range eraNames {
		if s == name {
			return Era(i), nil
		}
	}
	return 0, fmt.Errorf("cannot parse kv event era %q: want one of %s", s, strings.Join(eraNames[:], ", "))
}

// HashMode selects how block hashes travel on the wire (docs/internals/vllm-kv-events.md).
type HashMode int

const (
	// HashInt sends the last 8 bytes of the SHA-256 digest as a msgpack uint
	// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default).
	HashInt HashMode = iota
	// HashBytes sends the full 32-byte digest as msgpack bin (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
	HashBytes
)

// String returns the flag name of the mode.
func (m HashMode) String() string {
	switch m {
	case HashInt:
		return "int"
	case HashBytes:
		return "bytes"
	}
	return fmt.Sprintf("HashMode(%d)", int(m))
}

// ReplayLayout selects the frames of a replay reply (docs/internals/vllm-kv-events.md).
type ReplayLayout int

const (
	// ReplayNew answers [topic, seq, payload] per batch (vllm-project/vllm#45177, v0.26.0+).
	ReplayNew ReplayLayout = iota
	// ReplayOld answers [seq, payload] per batch (v0.25 and older).
	ReplayOld
)

// String returns the flag name of the layout.
func (l ReplayLayout) String() string {
	switch l {
	case ReplayNew:
		return "new"
	case ReplayOld:
		return "old"
	}
	return fmt.Sprintf("ReplayLayout(%d)", int(l))
}

// Faults are the injected failures. The zero value injects nothing.
// Engine.SetFaults swaps them on a running engine.
type Faults struct {
	// ErrorRate is the fraction (0..1) of completion requests answered with HTTP 500 in vLLM's
	// error shape. The choice is deterministic: request n fails when floor(n*rate) grows.
	ErrorRate float64
	// AddedLatency delays every completion request before it is queued.
	AddedLatency time.Duration
	// HangBeforeHeaders makes completion requests take a slot and never answer, until the client
	// goes away or the engine stops.
	HangBeforeHeaders bool
	// AbortAfterChunks ends a stream after this many SSE events, without [DONE], and closes the
	// connection. 0 = off.
	AbortAfterChunks int
	// DropEveryNthBatch skips sending every Nth KV event batch (seq N-1, 2N-1, …). The batch
	// still takes its sequence number and stays in the replay buffer, so a subscriber sees a gap
	// that replay can fill. 0 = off.
	DropEveryNthBatch int
	// GarbageEveryNBatches sends a garbage 3-frame message after every Nth batch:
	// [topic, 3 bytes de ad be (not an 8-byte seq), bytes that are not msgpack]. It takes no
	// sequence number and is not replayed. 0 = off.
	GarbageEveryNBatches int
}

// Config configures one simulated engine. Zero sizes and names mean the defaults listed per
// field; durations mean what they say (zero = instant). DefaultConfig returns the defaults with
// the demo latencies that `rolter sim` uses.
type Config struct {
	// Host to listen on; default 127.0.0.1.
	Host string
	// Port to listen on; 0 picks a free port (see Engine.Addr).
	Port int
	// Model is the served model name; default "sim-model".
	Model string
	// EngineLabel is the value of the `engine` metric label; default "0".
	EngineLabel string

	// KVEvents is the ZMQ PUB endpoint, e.g. "tcp://*:5557" or "tcp://127.0.0.1:*" (free port).
	// As in vLLM the socket binds when the endpoint contains "*" or "::" or is ipc:// or
	// inproc://, and connects otherwise (llm-d style, the subscriber binds). Empty = no events.
	KVEvents string
	// Replay is the ZMQ ROUTER endpoint answering replay requests; it always binds. Empty = off.
	// Needs KVEvents.
	Replay string
	// Topic is the first frame of every event message; default "" like vLLM.
	Topic string
	// Era is the event encoding; default EraMap.
	Era Era
	// HashMode is the block hash encoding; default HashInt.
	HashMode HashMode
	// ReplayLayout is the replay reply layout; default ReplayNew.
	ReplayLayout ReplayLayout
	// ReplayBuffer is the number of batches kept for replay; default 10000 (vLLM buffer_steps).
	ReplayBuffer int
	// BatchWindow is how long the publisher gathers events into one batch (one "engine step");
	// default 2ms.
	BatchWindow time.Duration

	// BlockSize is the number of tokens per KV block; default 16.
	BlockSize int
	// NumBlocks is the KV cache capacity in blocks; default 2048.
	NumBlocks int
	// MaxNumSeqs is the number of requests running at once; default 8.
	MaxNumSeqs int
	// MaxModelLen caps prompt + max_tokens; default and maximum NumBlocks*BlockSize.
	MaxModelLen int
	// MaxTokens is the number of output tokens when a request gives none; default 16.
	MaxTokens int
	// PrefillPerToken is the prefill cost of one uncached prompt token.
	PrefillPerToken time.Duration
	// DecodePerToken is the time between two output tokens.
	DecodePerToken time.Duration
	// IdleTimeout closes idle keep-alive connections; default 5s like uvicorn under vLLM.
	IdleTimeout time.Duration

	// Role is the engine's part in a prefill/decode-disaggregated fleet, as vLLM's NixlConnector
	// plays it (kv_role): RoleAggregated (default) ignores kv_transfer_params, RolePrefill
	// (kv_producer) holds the blocks of do_remote_decode requests for a decode to pull,
	// RoleDecode (kv_consumer) pulls the blocks named by do_remote_prefill requests, RoleBoth
	// (kv_both) does either, as each request's kv_transfer_params says.
	Role Role
	// EngineID is remote_engine_id in the kv_transfer_params this engine hands out, and the id a
	// pull must name; default a random UUID, as vLLM's KVTransferConfig.engine_id.
	EngineID string
	// SideChannelPort is where a prefill engine serves block pulls (on Host);
	// 0 = a free port (see Engine.SideChannelAddr). `rolter sim` defaults to 5600 like
	// VLLM_NIXL_SIDE_CHANNEL_PORT.
	SideChannelPort int
	// SideChannelHost is remote_host in the kv_transfer_params: the address a decode engine
	// reaches this engine's side channel at; default Host (VLLM_NIXL_SIDE_CHANNEL_HOST).
	SideChannelHost string
	// KVLease is how long a prefill engine keeps the blocks of a finished do_remote_decode
	// request that nobody pulled; default 480s (VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
	KVLease time.Duration
	// TransferPerBlock is the time a pull takes per block moved.
	TransferPerBlock time.Duration
	// KVLoadFailure is what a decode engine does when a pull fails: LoadFail (vLLM's default
	// kv_load_failure_policy "fail": the request fails with HTTP 500) or LoadRecompute (it
	// computes the prompt locally).
	KVLoadFailure LoadFailurePolicy
	// BootstrapTimeout is how long a prefill engine holds the blocks of a bootstrap_room request
	// for its decode engine before it frees them and answers 500; default 300s
	// (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT).
	BootstrapTimeout time.Duration
	// WaitingTimeout is how long a decode engine waits for a bootstrap_room request's blocks
	// before it answers 500; default 300s (SGLANG_DISAGGREGATION_WAITING_TIMEOUT).
	WaitingTimeout time.Duration

	// EnableLoRA serves LoRA adapters as vLLM's --enable-lora does: the adapters of LoRAModules
	// and, with AllowRuntimeLoRA, those loaded through /v1/load_lora_adapter (lora.go).
	EnableLoRA bool
	// MaxLoRAs is the number of adapters that can be in one batch: GPU adapter slots; default 1
	// (vLLM's --max-loras).
	MaxLoRAs int
	// MaxCPULoRAs is vLLM's --max-cpu-loras, kept for the banner; default MaxLoRAs. The sim
	// does not model the CPU cache of adapters.
	MaxCPULoRAs int
	// LoRAModules are the adapters registered at start (vLLM's --lora-modules).
	LoRAModules []LoRAModule
	// LoRALoadDelay is how long loading an adapter into a GPU slot takes, and how long a
	// /v1/load_lora_adapter call takes. `rolter sim` defaults to 100ms.
	LoRALoadDelay time.Duration
	// AllowRuntimeLoRA serves POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING does. Needs EnableLoRA.
	AllowRuntimeLoRA bool

	Faults
}

// LoRAModule is one adapter of --lora-modules: the model name requests use and its path
// (the "root" of its /v1/models card).
type LoRAModule struct {
	Name string
	Path string
}

// Role is an engine's part in a disaggregated fleet (vLLM's kv_role).
type Role string

// Roles. The empty role is the aggregated engine.
const (
	RoleAggregated Role = ""
	RolePrefill    Role = "prefill" // kv_producer
	RoleDecode     Role = "decode"  // kv_consumer
	RoleBoth       Role = "both"    // kv_both
)

func (r Role) prefills() bool { return r == RolePrefill || r == RoleBoth }
func (r Role) decodes() bool  { return r == RoleDecode || r == RoleBoth }

// LoadFailurePolicy is vLLM's kv_load_failure_policy.
type LoadFailurePolicy string

// Policies; the empty value means LoadFail, vLLM's default.
const (
	LoadFail      LoadFailurePolicy = "fail"
	LoadRecompute LoadFailurePolicy = "recompute"
)

const (
	defaultHost         = "127.0.0.1"
	defaultModel        = "sim-model"
	defaultEngineLabel  = "0"
	defaultReplayBuffer = 10000
	defaultBatchWindow  = 2 * time.Millisecond
	defaultBlockSize    = 16
	defaultNumBlocks    = 2048
	defaultMaxNumSeqs   = 8
	defaultMaxTokens    = 16
	defaultIdleTimeout  = 5 * time.Second
	defaultCLIPort      = 8000
	defaultSideChannel  = 5600 // VLLM_NIXL_SIDE_CHANNEL_PORT
	defaultKVLease      = 480 * time.Second
	defaultSGLangWait   = 300 * time.Second // SGLANG_DISAGGREGATION_{BOOTSTRAP,WAITING}_TIMEOUT
	defaultMaxLoRAs     = 1                 // vLLM's --max-loras
	defaultLoRALoad     = 100 * time.Millisecond

	// demo transfer latency: a 2k-token prompt (128 blocks) moves in 2.5ms.
	defaultTransferPerBlock = 20 * time.Microsecond

	// demo latencies: a 2k-token cold prompt costs 40ms of prefill, 16 output tokens 30ms.
	defaultPrefillPerToken = 20 * time.Microsecond
	defaultDecodePerToken  = 2 * time.Millisecond
)

// DefaultConfig returns the defaults of every knob, including the demo latencies
// (20µs prefill per uncached token, 2ms per output token). Port is 0 (a free port).
func DefaultConfig() Config {
	return Config{
		Host:             defaultHost,
		Model:            defaultModel,
		EngineLabel:      defaultEngineLabel,
		ReplayBuffer:     defaultReplayBuffer,
		BatchWindow:      defaultBatchWindow,
		BlockSize:        defaultBlockSize,
		NumBlocks:        defaultNumBlocks,
		MaxNumSeqs:       defaultMaxNumSeqs,
		MaxTokens:        defaultMaxTokens,
		PrefillPerToken:  defaultPrefillPerToken,
		DecodePerToken:   defaultDecodePerToken,
		IdleTimeout:      defaultIdleTimeout,
		KVLease:          defaultKVLease,
		TransferPerBlock: defaultTransferPerBlock,
		KVLoadFailure:    LoadFail,
		BootstrapTimeout: defaultSGLangWait,
		WaitingTimeout:   defaultSGLangWait,
		MaxLoRAs:         defaultMaxLoRAs,
		LoRALoadDelay:    defaultLoRALoad,
	}
}

// normalize fills the defaults and returns every problem at once.
func (c *Config) normalize() error {
	if c.Host == "" {
		c.Host = defaultHost
	}
	if c.Model == "" {
		c.Model = defaultModel
	}
	if c.EngineLabel == "" {
		c.EngineLabel = defaultEngineLabel
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = defaultReplayBuffer
	}
	if c.BatchWindow == 0 {
		c.BatchWindow = defaultBatchWindow
	}
	if c.BlockSize == 0 {
		c.BlockSize = defaultBlockSize
	}
	if c.NumBlocks == 0 {
		c.NumBlocks = defaultNumBlocks
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = defaultMaxNumSeqs
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = defaultMaxTokens
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = defaultIdleTimeout
	}
	if c.SideChannelHost == "" {
		c.SideChannelHost = c.Host
	}
	if c.KVLease == 0 {
		c.KVLease = defaultKVLease
	}
	if c.KVLoadFailure == "" {
		c.KVLoadFailure = LoadFail
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = defaultSGLangWait
	}
	if c.WaitingTimeout == 0 {
		c.WaitingTimeout = defaultSGLangWait
	}
	if c.MaxLoRAs == 0 {
		c.MaxLoRAs = defaultMaxLoRAs
	}
	if c.MaxCPULoRAs == 0 {
		c.MaxCPULoRAs = c.MaxLoRAs
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(format, args...))
	}
	errs = append(errs, c.validateLoRA()...)
	if c.Port < 0 || c.Port > 65535 {
		bad("port %d out of range 0..65535", c.Port)
	}
	if c.Era < 0 || c.Era >= eraCount {
		bad("unknown kv event era %d", int(c.Era))
	}
	if c.HashMode != HashInt && c.HashMode != HashBytes {
		bad("unknown hash mode %d", int(c.HashMode))
	}
	if c.ReplayLayout != ReplayNew && c.ReplayLayout != ReplayOld {
		bad("unknown replay layout %d", int(c.ReplayLayout))
	}
	if c.Replay != "" && c.KVEvents == "" {
		bad("replay endpoint %q needs a kv events endpoint", c.Replay)
	}
	if c.ReplayBuffer < 0 {
		bad("replay buffer %d must be positive", c.ReplayBuffer)
	}
	if c.BatchWindow < 0 {
		bad("batch window %s must not be negative", c.BatchWindow)
	}
	if c.BlockSize < 0 || c.BlockSize > 1024 {
		bad("block size %d out of range 1..1024", c.BlockSize)
	}
	if c.NumBlocks < 0 {
		bad("num blocks %d must be positive", c.NumBlocks)
	}
	if c.MaxNumSeqs < 0 {
		bad("max num seqs %d must be positive", c.MaxNumSeqs)
	}
	if c.MaxTokens < 0 {
		bad("max tokens %d must be positive", c.MaxTokens)
	}
	if c.PrefillPerToken < 0 || c.DecodePerToken < 0 || c.AddedLatency < 0 || c.IdleTimeout < 0 {
		bad("durations must not be negative")
	}
	capacity := c.NumBlocks * c.BlockSize
	if c.MaxModelLen == 0 {
		c.MaxModelLen = capacity
	}
	if c.MaxModelLen < 0 || c.MaxModelLen > capacity {
		bad("max model len %d out of range 1..%d (num blocks × block size)", c.MaxModelLen, capacity)
	}
	if c.MaxTokens >= c.MaxModelLen && c.MaxModelLen > 0 {
		bad("max tokens %d must be below max model len %d", c.MaxTokens, c.MaxModelLen)
	}
	switch c.Role {
	case RoleAggregated, RolePrefill, RoleDecode, RoleBoth:
	default:
		bad("unknown role %q: want prefill, decode, both or empty", string(c.Role))
	}
	if c.KVLoadFailure != LoadFail && c.KVLoadFailure != LoadRecompute {
		bad("unknown kv load failure policy %q: want fail or recompute", string(c.KVLoadFailure))
	}
	if c.SideChannelPort < 0 || c.SideChannelPort > 65535 {
		bad("side channel port %d out of range 0..65535", c.SideChannelPort)
	}
	if c.KVLease < 0 || c.TransferPerBlock < 0 {
		bad("kv lease and transfer time must not be negative")
	}
	if c.BootstrapTimeout < 0 || c.WaitingTimeout < 0 {
		bad("bootstrap and waiting timeouts must not be negative")
	}
	errs = append(errs, c.Faults.validate()...)
	return errors.Join(errs...)
}

func (f *Faults) validate() []error {
	var errs []error
	if !(f.ErrorRate >= 0 && f.ErrorRate <= 1) {
		errs = append(errs, fmt.Errorf("error rate %v out of range 0..1", f.ErrorRate))
	}
	if f.AddedLatency < 0 {
		errs = append(errs, fmt.Errorf("added latency %s must not be negative", f.AddedLatency))
	}
	if f.AbortAfterChunks < 0 || f.DropEveryNthBatch < 0 || f.GarbageEveryNBatches < 0 {
		errs = append(errs, fmt.Errorf("fault counts must not be negative"))
	}
	return errs
}

// ParseFlags parses the `rolter sim` flags (args without the program and subcommand names)
// into a Config that starts from DefaultConfig, with port 8000 like vLLM. Both -flag and
// --flag work. It returns flag.ErrHelp for -h; every invalid value is reported at once.
func ParseFlags(args []string) (Config, error) {
	cfg, fs := newFlagSet(io.Discard)
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("cannot parse flags: unexpected argument %q", fs.Arg(0))
	}
	errFlags := cfg.finish()
	c := cfg.cfg
	if err := errors.Join(errFlags, c.normalize()); err != nil {
		return Config{}, err
	}
	return c, nil
}

// flagConfig holds the flag values that need conversion after parsing.
type flagConfig struct {
	cfg          Config
	era          string
	hashMode     string
	replayLayout string
	prefillUS    float64
	decodeUS     float64
	latencyMS    float64
	role         string
	policy       string
	leaseS       float64
	transferUS   float64
	bootstrapS   float64
	waitingS     float64
	loraLoadMS   float64
	loraModules  loraModulesFlag
}

func newFlagSet(out io.Writer) (*flagConfig, *flag.FlagSet) {
	fc := &flagConfig{cfg: DefaultConfig()}
	fc.cfg.Port = defaultCLIPort
	c := &fc.cfg
	fs := flag.NewFlagSet("rolter sim", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.Host, "host", c.Host, "address to listen on")
	fs.IntVar(&c.Port, "port", c.Port, "HTTP port (0 = a free port)")
	fs.StringVar(&c.Model, "model", c.Model, "served model name")
	fs.StringVar(&c.EngineLabel, "engine-label", c.EngineLabel, "value of the engine label on /metrics")
	fs.StringVar(&c.KVEvents, "kv-events", "", `ZMQ PUB endpoint for KV events, e.g. "tcp://*:5557" (binds) or "tcp://host:port" (connects); empty = off`)
	fs.StringVar(&c.Replay, "replay", "", `ZMQ ROUTER replay endpoint, e.g. "tcp://*:5558"; empty = off`)
	fs.StringVar(&c.Topic, "topic", "", "topic frame of every KV event message")
	fs.StringVar(&fc.era, "kv-era", EraMap.String(), "KV event encoding: "+strings.Join(eraNames[:], ", "))
	fs.StringVar(&fc.hashMode, "hash-mode", "int", "block hashes on the wire: int (last 8 digest bytes) or bytes (full digest)")
	fs.StringVar(&fc.replayLayout, "replay-layout", "new", "replay reply frames: new ([topic, seq, payload], vLLM >= 0.26) or old ([seq, payload])")
	fs.IntVar(&c.ReplayBuffer, "replay-buffer", c.ReplayBuffer, "batches kept for replay")
	fs.IntVar(&c.BlockSize, "block-size", c.BlockSize, "tokens per KV block")
	fs.IntVar(&c.NumBlocks, "num-blocks", c.NumBlocks, "KV cache capacity in blocks")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", c.MaxNumSeqs, "requests running at once; the rest wait")
	fs.IntVar(&c.MaxModelLen, "max-model-len", 0, "maximum prompt + output tokens (0 = num-blocks × block-size)")
	fs.IntVar(&c.MaxTokens, "max-tokens", c.MaxTokens, "output tokens when a request sets no max_tokens")
	fs.Float64Var(&fc.prefillUS, "prefill-us-per-token", float64(c.PrefillPerToken)/1e3, "prefill microseconds per uncached prompt token")
	fs.Float64Var(&fc.decodeUS, "decode-us-per-token", float64(c.DecodePerToken)/1e3, "microseconds per output token")
	fs.StringVar(&fc.role, "role", "", "disaggregated role: prefill (kv_producer), decode (kv_consumer), both (kv_both); empty = aggregated")
	fs.StringVar(&c.EngineID, "engine-id", "", "remote_engine_id this engine hands out (empty = a random UUID)")
	fs.IntVar(&c.SideChannelPort, "side-channel-port", defaultSideChannel, "prefill role: port of the block pull side channel on --host (0 = a free port)")
	fs.StringVar(&c.SideChannelHost, "side-channel-host", "", "prefill role: remote_host handed to decoders (empty = --host)")
	fs.Float64Var(&fc.leaseS, "kv-lease-seconds", defaultKVLease.Seconds(), "prefill role: seconds unpulled blocks are held (VLLM_NIXL_ABORT_REQUEST_TIMEOUT)")
	fs.Float64Var(&fc.transferUS, "transfer-us-per-block", float64(defaultTransferPerBlock)/1e3, "microseconds a pull takes per block moved")
	fs.Float64Var(&fc.bootstrapS, "bootstrap-timeout-seconds", defaultSGLangWait.Seconds(), "prefill role, bootstrap_room requests: seconds a room's blocks wait for their decode (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)")
	fs.Float64Var(&fc.waitingS, "waiting-timeout-seconds", defaultSGLangWait.Seconds(), "decode role, bootstrap_room requests: seconds a decode waits for its room (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)")
	fs.StringVar(&fc.policy, "kv-load-failure-policy", string(LoadFail), "decode role: fail (HTTP 500, vLLM's default) or recompute when a pull fails")
	fs.BoolVar(&c.EnableLoRA, "enable-lora", false, "serve LoRA adapters (vLLM's --enable-lora)")
	fs.IntVar(&c.MaxLoRAs, "max-loras", c.MaxLoRAs, "LoRA adapters in one batch: GPU adapter slots")
	fs.IntVar(&c.MaxCPULoRAs, "max-cpu-loras", 0, "LoRA adapters kept in CPU memory (0 = max-loras; accepted, not modelled)")
	fs.Var(&fc.loraModules, "lora-modules", `LoRA adapters as name=path, comma or space separated, or a JSON object {"name","path"}; may repeat`)
	fs.Float64Var(&fc.loraLoadMS, "lora-load-ms", float64(defaultLoRALoad)/1e6, "milliseconds loading a LoRA adapter into a GPU slot (or through /v1/load_lora_adapter) takes")
	fs.BoolVar(&c.AllowRuntimeLoRA, "allow-runtime-lora", false, "serve /v1/load_lora_adapter and /v1/unload_lora_adapter (also VLLM_ALLOW_RUNTIME_LORA_UPDATING=True or 1)")
	fs.Float64Var(&c.ErrorRate, "error-rate", 0, "fault: fraction of requests answered with HTTP 500 (0..1)")
	fs.Float64Var(&fc.latencyMS, "added-latency-ms", 0, "fault: milliseconds added before each request is queued")
	fs.BoolVar(&c.HangBeforeHeaders, "hang", false, "fault: take a slot and never answer")
	fs.IntVar(&c.AbortAfterChunks, "abort-after-chunks", 0, "fault: end streams after N events without [DONE]")
	fs.IntVar(&c.DropEveryNthBatch, "drop-every-nth-batch", 0, "fault: do not send every Nth KV event batch (a sequence gap)")
	fs.IntVar(&c.GarbageEveryNBatches, "garbage-every-n-batches", 0, "fault: send a garbage message after every N batches")
	return fc, fs
}

func (fc *flagConfig) finish() error {
	var errs []error
	var err error
	c := &fc.cfg
	if c.Era, err = ParseEra(fc.era); err != nil {
		errs = append(errs, err)
	}
	switch fc.hashMode {
	case "int":
		c.HashMode = HashInt
	case "bytes":
		c.HashMode = HashBytes
	default:
		errs = append(errs, fmt.Errorf("cannot parse hash mode %q: want int or bytes", fc.hashMode))
	}
	switch fc.replayLayout {
	case "new":
		c.ReplayLayout = ReplayNew
	case "old":
		c.ReplayLayout = ReplayOld
	default:
		errs = append(errs, fmt.Errorf("cannot parse replay layout %q: want new or old", fc.replayLayout))
	}
	toDur := func(name string, v, unit float64) time.Duration {
		if v < 0 {
			errs = append(errs, fmt.Errorf("cannot use %s %v: must not be negative", name, v))
			return 0
		}
		return time.Duration(v * unit)
	}
	c.PrefillPerToken = toDur("prefill-us-per-token", fc.prefillUS, 1e3)
	c.DecodePerToken = toDur("decode-us-per-token", fc.decodeUS, 1e3)
	c.AddedLatency = toDur("added-latency-ms", fc.latencyMS, 1e6)
	c.TransferPerBlock = toDur("transfer-us-per-block", fc.transferUS, 1e3)
	c.KVLease = toDur("kv-lease-seconds", fc.leaseS, 1e9)
	if fc.leaseS == 0 {
		errs = append(errs, fmt.Errorf("cannot use kv-lease-seconds 0: must be positive"))
	}
	c.BootstrapTimeout = toDur("bootstrap-timeout-seconds", fc.bootstrapS, 1e9)
	c.WaitingTimeout = toDur("waiting-timeout-seconds", fc.waitingS, 1e9)
	if fc.bootstrapS == 0 || fc.waitingS == 0 {
		errs = append(errs, fmt.Errorf("cannot use a bootstrap or waiting timeout of 0: must be positive"))
	}
	c.Role = Role(fc.role)
	c.KVLoadFailure = LoadFailurePolicy(fc.policy)
	c.LoRALoadDelay = toDur("lora-load-ms", fc.loraLoadMS, 1e6)
	c.LoRAModules = append(c.LoRAModules, fc.loraModules.modules...)
	if c.EnableLoRA && runtimeLoRAFromEnv() {
		// vLLM mounts the runtime API under the variable alone; without LoRA it is of no use,
		// and an engine started without --enable-lora must not fail for an inherited variable.
		c.AllowRuntimeLoRA = true
	}
	return errors.Join(errs...)
}
