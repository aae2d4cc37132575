package disagg

// Object is what the protocol needs to know of a client's request body (the JSON object the engine sends
// upstream, model already substituted): where the suffixes go and which of the keys a prefill request
// overrides the body has.
//
// A suffix built by AppendPrefill, AppendDecode or AppendBootstrap is inserted at End, before the closing
// brace: body[:End] + suffix + body[End:]. Its members come after the client's, so they win where the keys
// repeat: vLLM and SGLang parse bodies with Python's json.loads (FastAPI's request.json()), which keeps the
// last value of a duplicate key (see the package documentation).
//
// An Object holds no reference to the body; it is a small value, safe to copy and to share.
type Object struct {
	// End is the index of the body's closing brace.
	End int
	// empty is set when the object has no members, so a suffix must not begin with a comma.
	empty bool
	// has is the set of prefill-overridden keys the body holds (bits of prefillKey).
	has uint8
}

// prefillKey is a key that a prefill request overrides only when the client's body has it, as vLLM's proxy
// does (it deletes or resets these and leaves them absent otherwise).
type prefillKey uint8

const (
	keyStreamOptions prefillKey = 1 << iota
	keyMaxCompletionTokens
	keyMinTokens
	keyMinCompletionTokens
)

var prefillKeys = [...]struct {
	name string
	bit  prefillKey
}{
	{"stream_options", keyStreamOptions},
	{"max_completion_tokens", keyMaxCompletionTokens},
	{"min_tokens", keyMinTokens},
	{"min_completion_tokens", keyMinCompletionTokens},
}

// Scan reads the client's request body: it must be exactly one JSON object, whitespace allowed around it.
// Nested values are checked strictly (strings, escapes, numbers, nesting up to 512 deep), so a brace inside
// a string never counts. The error is a *SyntaxError. The work is linear in len(body); nothing is allocated
// unless the body is refused. Safe for concurrent use; body is only read, and not retained.
func Scan(body []byte) (Object, error) {
	var o Object
	members := 0
	end, err := object(body, func(m member) {
		members++
		for _, k := range prefillKeys {
			if keyIs(m.key, k.name) {
				o.has |= uint8(k.bit)
			}
		}
	})
	if err != nil {
		return Object{}, err
	}
	o.End, o.empty = end, members == 0
	return o, nil
}

// Keys is a set of the keys a prefill request overrides when the body has them, for NewObject: bit 0
// stream_options, 1 max_completion_tokens, 2 min_tokens, 3 min_completion_tokens.
type Keys uint8

// NewObject returns the Object of a body that a scan of its own already read: the index of its closing
// brace, its number of members and which of the overridden keys it holds. A gateway that validates the
// body in one pass anyway needs no second one (Scan).
func NewObject(end, members int, keys Keys) Object {
	return Object{End: end, empty: members == 0, has: uint8(keys) & 0xf}
}

// Has reports whether the body holds name as a top-level key, for the keys a prefill request treats
// specially: "stream_options", "max_completion_tokens", "min_tokens", "min_completion_tokens". Any other
// name reports false.
func (o Object) Has(name string) bool {
	for _, k := range prefillKeys {
		if k.name == name {
			return o.has&uint8(k.bit) != 0
		}
	}
	return false
}

// sep appends the separator that opens a suffix: a comma after the client's last member, nothing in an
// empty object.
func (o Object) sep(dst []byte) []byte {
	if o.empty {
		return dst
	}
	return append(dst, ',')
}
