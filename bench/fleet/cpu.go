package fleet

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUMeter measures the CPU other processes used while a cell ran: on a shared machine a cell's latencies
// say little when other work took the CPUs. Linux only (/proc); elsewhere it reports -1.
type CPUMeter struct {
	start      time.Time
	busy, self float64 // seconds of CPU: the whole machine's non-idle time, and this process's
	ok         bool
}

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/self/stat (100 on every Linux architecture
// Go supports).
const clockTicks = 100

func StartCPUMeter() CPUMeter {
	busy, ok1 := MachineBusy()
	self, ok2 := SelfCPU()
	return CPUMeter{start: time.Now(), busy: busy, self: self, ok: ok1 && ok2}
}

// Others returns the mean number of CPUs other processes (and the hypervisor's steal) kept busy since
// start, or -1 when unknown.
func (m CPUMeter) Others() float64 {
	busy, ok1 := MachineBusy()
	self, ok2 := SelfCPU()
	elapsed := time.Since(m.start).Seconds()
	if !m.ok || !ok1 || !ok2 || elapsed <= 0 {
		return -1
	}
	return max(0, (busy-m.busy)-(self-m.self)) / elapsed
}

// MachineBusy returns the machine's non-idle CPU seconds from /proc/stat: user, nice, system, irq,
// softirq and steal (guest time is inside user).
func MachineBusy() (float64, bool) { return StatCPU(1, 2, 3, 6, 7, 8) }

// StatCPU returns the sum of the given fields of /proc/stat's "cpu" line (1 user ... 8 steal), in seconds.
func StatCPU(fields ...int) (float64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	total := 0.0
	for _, i := range fields {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return 0, false
		}
		total += v
	}
	return total / clockTicks, true
}

// SelfCPU returns this process's user + system CPU seconds.
func SelfCPU() (float64, bool) { return ProcessCPU("/proc/self/stat") }

// ProcessCPU returns the user + system CPU seconds of the process whose /proc/PID/stat is path.
func ProcessCPU(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; the fields after it start past its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 { // f[0] is field 3 (state); utime and stime are fields 14 and 15
		return 0, false
	}
	u, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (u + st) / clockTicks, true
}

func OtherCPU(v float64) string {
	if v < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", v)
}
