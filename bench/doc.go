// Package bench holds Rolter's reports, one package each, and nothing else: bench/routing (routing
// quality), bench/overhead (gateway overhead), bench/ab (two builds on the overhead loop),
// bench/instructions (instruction count under valgrind), bench/pressure (KV pressure), bench/scaleout
// (many gateways behind HAProxy) and bench/replay (`rolter replay`). bench/fleet is what they share: the
// simulated fleet, child processes, the fake upstream, the machine's description and the report writers.
// The mains are under bench/cmd; README.md here has the method, results/ the last numbers.
package bench
