// Package loadtest is Rolter's load-test harness: it generates a workload, sends it to an
// OpenAI-compatible endpoint (the gateway, or one engine) with vegeta's library
// (github.com/tsenart/vegeta/v12/lib), and measures what cache-aware routing is for.
//
// # Scenarios
//
//	shared-prefix  SGLang's generated-shared-prefix shape: groups × prompts per group, each
//	               prompt a group's system prompt plus a unique question; uniform popularity
//	               (every group the same number of prompts, shuffled) or zipf.
//	multi-turn     production-stack's multi-round QA shape: users × rounds, one shared system
//	               prompt plus per-user history; round r carries every earlier question and
//	               answer and is sent only after the answer of round r-1 arrived.
//	hot-prefix     every request shares one long prefix and has a unique suffix.
//	random         unrelated prompts.
//
// Text is built from three-letter words, each exactly one token of the sim's tokenizer
// (sim.AppendTokens), so token counts are exact; the first words of every text that must differ
// spell its id, so unrelated prompts share no block. A seed fixes the prompts and their order.
//
// # Load
//
// Closed loop (Concurrency requests in flight, vegeta with Workers = MaxWorkers = Concurrency
// and an unpaced pacer) or open loop (Rate per second). Every run is bounded by count
// (MaxRequests, default the workload's size) and by time (Duration, after which requests in
// flight are cancelled). Targets must be loopback unless AllowRemote.
//
// # Measures
//
// Requests stream (stream: true, stream_options.include_usage: true), so the time to the first
// body byte is the time to the first token, measured by TimingTransport (an http.RoundTripper
// keyed by vegeta's X-Vegeta-Seq header; the clock starts when the request is handed to the
// transport, after any tokenization). Latency is to the end of the body. The token hit rate is
// Σ usage.prompt_tokens_details.cached_tokens / Σ usage.prompt_tokens over successful
// requests, next to the Oracle bound for the prompts actually sent. x-rolter-target gives the
// per-target share (max/min), x-rolter-decision the decision counts.
//
// For precise_cache_aware, TokenIDs sends x-rolter-vllm-token-ids with the ids the engine's
// /tokenize returns for the prompt (cached per prompt), as a client of a vLLM fleet would.
//
// # Explicit plans
//
// Options.Plan sends a list of requests built elsewhere instead of a scenario: `rolter replay`
// (bench.Replay) turns a captured or Mooncake trace into one. Each request may carry its own
// max_tokens, an x-session-id, and a dependency on an earlier request (its session's previous
// turn): in a closed loop the next request whose predecessor has ended goes first, so a waiting
// session holds no worker; a Timed plan sends each request at its time. CapacityOracle adds a
// capacity-aware estimate next to the unlimited Oracle (Options.OracleCapacity).
//
// Run returns a Result (JSON via WriteJSON, Markdown via Markdown). Main is the
// `rolter loadtest` command.
package loadtest
