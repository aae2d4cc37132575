package bench

import (
	"os"
	"strconv"
	"strings"
	"syscall"
)

// sysProcAttr makes the kernel kill a child when the report process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// ephemeralLow is the first port of the kernel's ephemeral range (net.ipv4.ip_local_port_range), 0 if
// unknown.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	lo, _ := strconv.Atoi(f[0])
	return lo
}
