package fleet

import "syscall"

// sysProcAttr makes the kernel kill a child when the report process dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
