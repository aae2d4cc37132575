// Package instructions is the instruction count (bench/cmd/instructions, `make bench-instructions`):
// `rolter serve` runs under valgrind's cachegrind, which counts the instructions the process executes in
// user space, whatever else the machine does, and the load generator sends it a fixed number of requests
// over keep-alive connections, in the overhead report's cases. Instructions per proxied request are the
// gateway's own work (its code, fasthttp's, the Go runtime's) without the kernel's and without this
// machine's noise: runs agree within about 1% (small case) and 2.5% (cache case), where the overhead
// report's wall-clock throughput, on a shared 2-core machine, varies by several percent.
//
// Instructions are not time: a cache miss or a system call costs more than its instructions. The overhead
// report measures time; this measures work.
package instructions
