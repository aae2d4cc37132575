// Package fleet holds what every report shares: a fleet of simulated engines behind an in-process
// gateway (Start, Sampler), child processes (Proc: the fake upstream, `rolter serve`, HAProxy), the
// machine's description and CPU counters, the fake OpenAI upstream, and the Markdown/JSON report
// writers and goal verdicts. It imports nothing from the reports built on it.
package fleet
