package promptkey

import "golang.org/x/sys/cpu"

// plainRunAVX2 is in plainrun_amd64.s.
//
//go:noescape
func plainRunAVX2(p *byte, n int) int

var haveAVX2 = cpu.X86.HasAVX2

// plainRunBlocks returns the index of the first byte of b that is not plain (see plainRun) or, when there is
// none, how many leading bytes it checked: 32 at a time, with AVX2.
func plainRunBlocks(b []byte) int {
	if !haveAVX2 || len(b) < 32 {
		return 0
	}
	return plainRunAVX2(&b[0], len(b))
}
