package overhead

import (
	"os"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/bench/fleet"
)

// counters is one read of the CPU counters around a closed loop: the machine's busy and interrupt CPU
// seconds, this process's, the gateway's and the upstream's, and the gateway's context switches. Each ok
// field tells whether its value could be read (no /proc: false).
type counters struct {
	busy, irq, self, gw, up                 float64
	sw                                      int64
	okBusy, okIRQ, okSelf, okGW, okUp, okSw bool
}

// readCounters reads the counters of the gateway gwPID and the upstream upPID (0: none).
func readCounters(gwPID, upPID int) counters {
	var c counters
	c.busy, c.okBusy = fleet.MachineBusy()
	c.irq, c.okIRQ = interruptCPU()
	c.self, c.okSelf = fleet.SelfCPU()
	c.gw, c.okGW = procCPU(gwPID)
	c.up, c.okUp = procCPU(upPID)
	c.sw, c.okSw = procSwitches(gwPID)
	return c
}

// cpuOver fills res's CPU figures from the counters c0 before and c1 after a loop of elapsed seconds
// that served res.count requests; gwPID and upPID are as readCounters's. A figure that cannot be told
// stays as res has it (-1).
func cpuOver(res *throughputResult, c0, c1 counters, elapsed float64, gwPID, upPID int) {
	if c0.okBusy && c1.okBusy {
		res.machineCPU = (c1.busy - c0.busy) / elapsed
	}
	if c0.okSelf && c1.okSelf {
		res.clientCPU = (c1.self - c0.self) / elapsed
	}
	gwOK := gwPID == 0 || c0.okGW && c1.okGW
	switch {
	case gwPID == 0:
		res.gatewayCPU = 0
	case gwOK && res.count > 0:
		res.gatewayCPU = (c1.gw - c0.gw) * 1e6 / float64(res.count)
	}
	switch {
	case gwPID == 0:
		res.gatewaySwitches = 0
	case c0.okSw && c1.okSw && res.count > 0:
		res.gatewaySwitches = float64(c1.sw-c0.sw) / float64(res.count)
	}
	// Without an upstream process (tests) its CPU is this process's.
	upOK := upPID == 0 || c0.okUp && c1.okUp
	if res.machineCPU >= 0 && res.clientCPU >= 0 && gwOK && upOK && c0.okIRQ && c1.okIRQ {
		res.otherCPU = max(0, res.machineCPU-res.clientCPU-((c1.irq-c0.irq)+(c1.gw-c0.gw)+(c1.up-c0.up))/elapsed)
	}
}

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
