package engine

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"

	"github.com/valyala/fasthttp"
)

// Loop detection. Every request the gateway sends upstream carries X-Rolter-Hop: the hop list it came with
// (from another gateway), then this gateway's id, drawn at random when it is made. A request whose list
// holds the gateway's own id has come back to it - a provider's api_base reaches the gateway itself, under a
// name or through a proxy the config check cannot see - and is answered 508 at once, so a loop costs one
// extra request instead of connections until the cap. Chains of distinct gateways still work, up to
// maxHops of them.
const (
	hopHeader = "X-Rolter-Hop" // in the canonical form fasthttp stores names in
	maxHops   = 8
)

// newHopID returns a gateway's hop id: 16 hex digits, random.
func newHopID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// checkLoop refuses a request whose hop list (the X-Rolter-Hop value it came with) names this gateway, or
// that has passed maxHops gateways already.
func (g *Gateway) checkLoop(hops []byte) *apiError {
	if len(hops) == 0 {
		return nil
	}
	n := 0
	for len(hops) > 0 {
		item := hops
		if i := bytes.IndexByte(hops, ','); i >= 0 {
			item, hops = hops[:i], hops[i+1:]
		} else {
			hops = nil
		}
		item = bytes.TrimSpace(item)
		if string(item) == g.hopID {
			return loopDetected("the request came back to this gateway: a provider's api_base reaches the gateway itself")
		}
		n++
	}
	if n >= maxHops {
		return loopDetected("the request has passed through too many gateways")
	}
	return nil
}

func loopDetected(msg string) *apiError {
	return &apiError{status: fasthttp.StatusLoopDetected, typ: typeServer, code: "loop_detected", message: msg, noRetry: true}
}
