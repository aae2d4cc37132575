package disagg

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Bounds on a prefill answer, which the gateway treats as hostile input. The engine should stop reading a
// prefill answer at MaxAnswerBytes (a longer one is refused here anyway).
const (
	// MaxAnswerBytes bounds a whole prefill answer. An answer of one token is small, but vLLM echoes what
	// the client asked for: prompt_logprobs or echo can make it as large as the prompt several times over.
	MaxAnswerBytes = 16 << 20
	// MaxKVTransferParamsBytes bounds the kv_transfer_params object copied into the decode request. The
	// NixlConnector's holds one block id per KV block of the prompt (a few tens of KB for a 128k-token
	// prompt) and a few scalars.
	MaxKVTransferParamsBytes = 1 << 20
)

var (
	// ErrNoKVTransferParams is returned when the prefill answer is valid but holds no kv_transfer_params
	// (absent, as in a chat answer, or null, as in a completions answer). vLLM's NixlConnector returns
	// them only for a request it stopped at max_tokens (FINISHED_LENGTH_CAPPED); one that stopped on its
	// first token (an EOS or stop string) keeps no blocks for a remote decode. vLLM's proxy then sends the
	// decode engine the plain request, which it prefills itself: AppendDecode(dst, o, nil).
	ErrNoKVTransferParams = errors.New("prefill answer has no kv_transfer_params")
	// ErrAnswerTooLarge is returned for an answer longer than MaxAnswerBytes, before any of it is read.
	ErrAnswerTooLarge = errors.New("prefill answer is larger than 16 MiB")
)

// ParsePrefillAnswer returns the "kv_transfer_params" object of a prefill answer (the JSON body of a 2xx
// answer to AppendPrefill's request), as a subslice of answer, valid as long as answer is. As Python would,
// it takes the last such key when the answer repeats it, spelled with escapes or not.
//
// The answer must be one JSON object, strictly valid, nested at most 512 deep, at most MaxAnswerBytes long;
// the params must be an object of valid UTF-8, at most MaxKVTransferParamsBytes long. So what it returns
// can be copied into a request body as it is: a balanced object that cannot end the body early or add
// members of its own. Absent or null params return ErrNoKVTransferParams; any other failure wraps a
// *SyntaxError or says what was wrong. The work is linear in len(answer), with no recursion; nothing is
// allocated unless an error is returned. Safe for concurrent use.
func ParsePrefillAnswer(answer []byte) (kvParams []byte, err error) {
	if len(answer) > MaxAnswerBytes {
		return nil, ErrAnswerTooLarge
	}
	if _, err = object(answer, func(m member) {
		if keyIs(m.key, "kv_transfer_params") {
			kvParams = m.value
		}
	}); err != nil {
		return nil, fmt.Errorf("cannot parse prefill answer: %w", err)
	}
	switch {
	case kvParams == nil || string(kvParams) == "null":
		return nil, ErrNoKVTransferParams
	case kvParams[0] != '{':
		return nil, fmt.Errorf("cannot use prefill answer: kv_transfer_params is %s, not an object", kind(kvParams[0]))
	case len(kvParams) > MaxKVTransferParamsBytes:
		return nil, fmt.Errorf("cannot use prefill answer: kv_transfer_params has %d bytes, more than %d",
			len(kvParams), MaxKVTransferParamsBytes)
	case !utf8.Valid(kvParams):
		return nil, errors.New("cannot use prefill answer: kv_transfer_params is not valid UTF-8")
	}
	return kvParams, nil
}

// kind names the JSON type of a value from its first byte, for error messages.
func kind(c byte) string {
	switch c {
	case '"':
		return "a string"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}
