//go:build !linux

package bench

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }

// ephemeralLow is the first port of the kernel's ephemeral range; unknown (0) here.
func ephemeralLow() int { return 0 }
