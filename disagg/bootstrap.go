package disagg

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// AppendBootstrap appends to dst the suffix of SGLang's disaggregation protocol and returns the extended
// buffer. Insert it at o.End. The same suffix makes both requests: SGLang's routers send the client's body,
// unchanged but for these three members, to the prefill and the decode engine at once (mini_lb.py
// _forward_to_backend; sgl-model-gateway's RequestWithBootstrap), and the two engines meet in the room.
//
//   - "bootstrap_host": the prefill engine's host, as a JSON string; an IPv6 literal is written in
//     brackets, as mini_lb.py does (maybe_wrap_ipv6_address);
//   - "bootstrap_port": the prefill engine's bootstrap port (its --disaggregation-bootstrap-port, 8998 by
//     default), or null when port is 0, as sgl-model-gateway sends for a worker without one configured;
//   - "bootstrap_room": room, the same for both requests and new for each client request (NewRoom).
//
// SGLang types them Optional[str], Optional[int] and Optional[int] for a single request (ChatCompletionRequest,
// CompletionRequest, GenerateReqInput). Nothing else changes: not stream, not max_tokens. Nothing is
// allocated when dst has room. Safe for concurrent use.
func AppendBootstrap(dst []byte, o Object, host string, port uint16, room uint64) []byte {
	dst = o.sep(dst)
	dst = append(dst, `"bootstrap_host":"`...)
	bracket := strings.IndexByte(host, ':') >= 0 && !strings.HasPrefix(host, "[")
	if bracket {
		dst = append(dst, '[')
	}
	dst = appendEscaped(dst, host)
	if bracket {
		dst = append(dst, ']')
	}
	dst = append(dst, `","bootstrap_port":`...)
	if port == 0 {
		dst = append(dst, "null"...)
	} else {
		dst = strconv.AppendUint(dst, uint64(port), 10)
	}
	dst = append(dst, `,"bootstrap_room":`...)
	return strconv.AppendUint(dst, room&maxRoom, 10)
}

// maxRoom is the largest room: SGLang's routers draw rooms in [0, 2^63-1] (mini_lb.py
// random.randint(0, 2**63 - 1); sgl-model-gateway masks a random u64 with i64::MAX), which fits the int64
// of every engine-side parser.
const maxRoom = 1<<63 - 1

// NewRoom returns a random bootstrap room in [0, 2^63-1], from the runtime's per-goroutine source (not for
// secrets; rooms only need to differ between requests in flight). Safe for concurrent use; no allocation.
func NewRoom() uint64 { return rand.Uint64() & maxRoom }

// appendEscaped appends s as the inside of a JSON string: quotes, backslashes and control characters
// escaped, anything else as it is.
func appendEscaped(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20:
			dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}
