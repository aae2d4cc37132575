//go:build !amd64

package promptkey

// haveAVX2 is false where there is no vector version: plainRun's words do it all.
var haveAVX2 = false

func plainRunBlocks([]byte) int { return 0 }
