package loadtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const mainUsage = `Usage: rolter loadtest [flags]

Sends one scenario (shared-prefix, multi-turn, hot-prefix, random) to an OpenAI-compatible
endpoint with vegeta and prints a Markdown table: TTFT, latency, throughput, token hit rate
(usage.prompt_tokens_details.cached_tokens) against the oracle bound, per-target share
(x-rolter-target) and decisions (x-rolter-decision). Loopback targets only, unless
-allow-remote. Bounded by -max-requests and -duration.

Flags:
`

// Main runs `rolter loadtest` with args (the flags after the subcommand name). The Markdown
// report goes to stdout, problems to stderr. It returns 0 when every request succeeded, 1 when
// the run could not start or some requests failed, 2 for bad flags. SIGINT/SIGTERM end the run
// early and still report.
func Main(args []string, stdout io.Writer) int {
	return mainWithStderr(args, stdout, os.Stderr)
}

func mainWithStderr(args []string, stdout, stderr io.Writer) int {
	usageOut := stderr
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			usageOut = stdout // asked for: not an error
		}
	}
	o, jsonPath, err := ParseFlags(args, usageOut)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "rolter loadtest: %s\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "rolter loadtest: %s\n", err)
		return 1
	}
	fmt.Fprintln(stdout, res.Markdown())
	if jsonPath != "" {
		f, err := os.Create(jsonPath)
		if err != nil {
			fmt.Fprintf(stderr, "rolter loadtest: cannot create %q: %s\n", jsonPath, err)
			return 1
		}
		err = res.WriteJSON(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintf(stderr, "rolter loadtest: %s\n", err)
			return 1
		}
	}
	if res.Failed > 0 || res.Cancelled > 0 || res.Succeeded == 0 {
		return 1
	}
	return 0
}

// ParseFlags parses the `rolter loadtest` flags into Options and the -json path. Workload knobs
// left at their zero value take the scenario's defaults (DefaultWorkload). Usage goes to out on
// -h (flag.ErrHelp is returned then).
func ParseFlags(args []string, out io.Writer) (Options, string, error) {
	var o Options
	var jsonPath, targets string
	var scenario string
	var w Workload
	fs := flag.NewFlagSet("rolter loadtest", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, mainUsage)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.URL, "url", "http://127.0.0.1:8080", "base URL of the gateway or engine (requests go to URL/v1/chat/completions)")
	fs.StringVar(&o.Model, "model", defaultModel, "model name to send")
	fs.StringVar(&scenario, "scenario", SharedPrefix, "workload: "+strings.Join(Scenarios, ", "))
	fs.Uint64Var(&w.Seed, "seed", 1, "workload seed (the same seed sends the same prompts)")
	fs.IntVar(&w.Groups, "groups", 0, "shared-prefix: number of groups (default 64)")
	fs.IntVar(&w.PromptsPerGroup, "prompts-per-group", 0, "shared-prefix: prompts per group (default 16)")
	fs.StringVar(&w.Popularity, "popularity", "", "shared-prefix: group popularity, uniform or zipf (default uniform)")
	fs.Float64Var(&w.ZipfS, "zipf-s", 0, "shared-prefix: zipf exponent, > 1 (default 1.1)")
	fs.IntVar(&w.Users, "users", 0, "multi-turn: users (default 32)")
	fs.IntVar(&w.Rounds, "rounds", 0, "multi-turn: rounds per user (default 8)")
	fs.IntVar(&w.HistoryTokens, "history-tokens", 0, "multi-turn: per-user history tokens in the first round (default 256)")
	fs.IntVar(&w.Requests, "requests", 0, "hot-prefix and random: number of requests (defaults 512 and 256)")
	fs.IntVar(&w.SystemTokens, "system-tokens", 0, "system prompt (shared prefix) tokens (scenario default)")
	fs.IntVar(&w.QuestionTokens, "question-tokens", 0, "question / unique suffix tokens (scenario default)")
	fs.IntVar(&w.OutputTokens, "output-tokens", 0, "max_tokens per request (default 64)")
	fs.Float64Var(&o.Rate, "rate", 0, "open loop: requests per second; 0 = closed loop at -concurrency")
	fs.IntVar(&o.Concurrency, "concurrency", defaultConcurrency, "closed loop: requests in flight; open loop: the most in flight")
	fs.IntVar(&o.MaxRequests, "max-requests", 0, "stop after this many requests (default: the whole workload)")
	fs.DurationVar(&o.Duration, "duration", defaultDuration, "bound on the whole run; requests in flight then are cancelled")
	fs.DurationVar(&o.Timeout, "timeout", defaultTimeout, "bound on one request, body included")
	fs.BoolVar(&o.NonStream, "no-stream", false, `send "stream": false (TTFT is then the whole response)`)
	fs.BoolVar(&o.TokenIDs, "token-ids", false, "send x-rolter-vllm-token-ids from the engine's /tokenize (for precise_cache_aware)")
	fs.StringVar(&o.TokenizeURL, "tokenize-url", "", "engine base URL whose /tokenize gives the token ids (default -url)")
	fs.StringVar(&targets, "targets", "", "comma-separated target names expected in x-rolter-target (idle ones count in the share)")
	fs.IntVar(&o.BlockSize, "block-size", 16, "KV block size for the oracle bound")
	fs.StringVar(&o.APIKey, "api-key", "", "sent as Authorization: Bearer <key>")
	fs.BoolVar(&o.AllowRemote, "allow-remote", false, "allow non-loopback URLs")
	fs.StringVar(&jsonPath, "json", "", "also write the result as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	if fs.NArg() > 0 {
		return o, "", fmt.Errorf("cannot parse flags: unexpected argument %q", fs.Arg(0))
	}
	o.Workload = mergeWorkload(DefaultWorkload(scenario), w)
	if targets != "" {
		for _, t := range strings.Split(targets, ",") {
			if t = strings.TrimSpace(t); t != "" {
				o.Targets = append(o.Targets, t)
			}
		}
	}
	if err := o.Workload.Validate(); err != nil {
		return o, "", err
	}
	return o, jsonPath, nil
}

// mergeWorkload returns def with every non-zero knob of set applied.
func mergeWorkload(def, set Workload) Workload {
	pick := func(d *int, s int) {
		if s != 0 {
			*d = s
		}
	}
	def.Seed = set.Seed
	pick(&def.Groups, set.Groups)
	pick(&def.PromptsPerGroup, set.PromptsPerGroup)
	pick(&def.Users, set.Users)
	pick(&def.Rounds, set.Rounds)
	pick(&def.HistoryTokens, set.HistoryTokens)
	pick(&def.Requests, set.Requests)
	pick(&def.SystemTokens, set.SystemTokens)
	pick(&def.QuestionTokens, set.QuestionTokens)
	pick(&def.OutputTokens, set.OutputTokens)
	if set.Popularity != "" {
		def.Popularity = set.Popularity
	}
	if set.ZipfS != 0 {
		def.ZipfS = set.ZipfS
	}
	return def
}
