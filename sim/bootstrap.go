package sim

import (
	"bytes"
	"strconv"

	"github.com/valyala/fastjson"
)

// bootParams are the members SGLang's routers add to a disaggregated request (mini_lb.py
// _forward_to_backend; sgl-model-gateway's pd_router): "bootstrap_host", "bootstrap_port" and
// "bootstrap_room", the same on the prefill and the decode request. SGLang's request models type
// them Optional[Union[List[str], str]], Optional[Union[List[Optional[int]], int]] and
// Optional[Union[List[int], int]] (entrypoints/openai/protocol.py); the lists are for batched
// /generate bodies, which the sim does not serve.
type bootParams struct {
	set  bool   // the body has a "bootstrap_room" member: the request speaks SGLang's protocol
	room []byte // the room as its JSON integer literal, the key both engines meet under
	host []byte // the prefill engine's host; empty for null
	port int    // the prefill engine's bootstrap port; 0 for null
}

func (b *bootParams) reset() {
	b.set = false
	b.room, b.host = b.room[:0], b.host[:0]
	b.port = 0
}

// errNoRoom is what SGLang's scheduler answers a disaggregated engine's request whose
// bootstrap_room is None (managers/scheduler.py, handle_generate_request: prepare_abort with
// HTTPStatus.BAD_REQUEST).
const errNoRoom = "Disaggregated request received without bootstrap room id"

// parseBootstrap reads v's bootstrap members. A member of the wrong type is a 400 in the shape of
// SGLang's RequestValidationError handler (http_server.py: FastAPI's 422 turned into 400). The sim
// is stricter than pydantic's lax mode: it takes integers only as JSON integers (not "7", true or
// 7.0).
func (r *request) parseBootstrap(v *fastjson.Value, role Role) *apiError {
	b := &r.boot
	rv := v.Get("bootstrap_room")
	if rv == nil {
		return nil
	}
	b.set = true
	switch rv.Type() {
	case fastjson.TypeNull:
		return sglangBadRequest(errNoRoom)
	case fastjson.TypeNumber:
		b.room = rv.MarshalTo(b.room[:0])
		if !integerLiteral(b.room) {
			return sglangBadRequest("bootstrap_room: Input should be a valid integer, got " + string(b.room))
		}
	case fastjson.TypeArray:
		return sglangBadRequest("bootstrap_room: a list is for batched /generate requests; the sim serves one prompt per body")
	default:
		return sglangBadRequest("bootstrap_room: Input should be a valid integer")
	}
	if hv := v.Get("bootstrap_host"); hv != nil && hv.Type() != fastjson.TypeNull {
		s, err := hv.StringBytes()
		if err != nil {
			return sglangBadRequest("bootstrap_host: Input should be a valid string")
		}
		if len(s) > 256 || !plainID(s) {
			return sglangBadRequest("bootstrap_host: want a printable host of at most 256 bytes")
		}
		b.host = append(b.host[:0], s...)
	}
	if pv := v.Get("bootstrap_port"); pv != nil && pv.Type() != fastjson.TypeNull {
		raw := pv.MarshalTo(nil)
		if pv.Type() != fastjson.TypeNumber || !integerLiteral(raw) {
			return sglangBadRequest("bootstrap_port: Input should be a valid integer")
		}
		n, err := strconv.Atoi(string(raw))
		if err != nil || n < 1 || n > 65535 {
			// pydantic takes any int; SGLang would then fail to connect. The sim says why at once.
			return sglangBadRequest("bootstrap_port: want a port number 1..65535 or null, got " + string(raw))
		}
		b.port = n
	}
	if role == RoleBoth {
		return sglangBadRequest("bootstrap_room needs an engine started with --role prefill or decode (SGLang's --disaggregation-mode); this one is both")
	}
	return nil
}

// integerLiteral reports whether a JSON number literal is an integer: no fraction, no exponent.
func integerLiteral(n []byte) bool {
	return len(n) > 0 && !bytes.ContainsAny(n, ".eE")
}

// sglangBadRequest is a 400 in SGLang's shape.
func sglangBadRequest(msg string) *apiError {
	return &apiError{status: 400, typ: "Bad Request", msg: msg, sglang: true}
}

// appendSGLangError appends SGLang's ErrorResponse (entrypoints/openai/protocol.py):
// {"object":"error","message","type","param":null,"code"}, not nested under "error" as vLLM's is.
func appendSGLangError(dst []byte, e *apiError) []byte {
	dst = append(dst, `{"object":"error","message":`...)
	dst = appendJSONString(dst, e.msg)
	dst = append(dst, `,"type":`...)
	dst = appendJSONString(dst, e.typ)
	dst = append(dst, `,"param":null,"code":`...)
	dst = strconv.AppendInt(dst, int64(e.status), 10)
	return append(dst, '}')
}

// roomError is a 500 the way SGLang's OpenAI server answers a request the scheduler aborted
// (serving_base.py handle_request: HTTPException -> create_error_response with type
// str(status_code)).
func roomError(msg string) *apiError {
	return &apiError{status: 500, typ: "500", msg: msg, sglang: true}
}
