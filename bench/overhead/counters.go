package overhead

import (
	"os"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// interruptCPU returns the machine's irq + softirq CPU seconds from /proc/stat: loopback TCP is
// handled there, for the report's processes, without being charged to them.
func interruptCPU() (float64, bool) { return fleet.StatCPU(6, 7) }

// procSwitches returns the context switches of every thread of process pid so far, voluntary (the thread
// slept: a wait, a lock, a blocking call) and not (it was preempted), from /proc/PID/task/*/status.
func procSwitches(pid int) (int64, bool) {
	if pid <= 0 {
		return 0, false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, false
	}
	var n int64
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/status")
		if err != nil {
			continue // the thread exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			// voluntary_ctxt_switches and nonvoluntary_ctxt_switches
			if _, v, ok := strings.Cut(line, "ctxt_switches:"); ok {
				k, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += k
			}
		}
	}
	return n, true
}

// procCPU returns the user + system CPU seconds of process pid.
func procCPU(pid int) (float64, bool) {
	if pid <= 0 {
		return 0, false
	}
	return fleet.ProcessCPU("/proc/" + strconv.Itoa(pid) + "/stat")
}
