package overhead

import (
	"slices"
)

// yardsticks are the refproxy paths and their -mode.
var yardsticks = []struct{ path, mode string }{{PathNullFastHTTP, "fasthttp"}, {PathNullNet, "goroutine"}, {PathNullLean, "lean"}}

func isYardstick(path string) bool {
	return slices.ContainsFunc(yardsticks, func(y struct{ path, mode string }) bool { return y.path == path })
}
