package sim

// The simulated tokenizer. It only has to be deterministic, cheap and prefix-stable, so that
// the prefix cache, /tokenize and a gateway that tokenizes the same way all agree on ids.

// Token ids below firstPieceID are reserved for the chat template markers.
const (
	tokenIMStart = 2 // starts a message: <|im_start|>
	tokenIMEnd   = 3 // ends a message: <|im_end|>
	tokenRoleEnd = 4 // separates the role from the content

	firstPieceID = 100
	vocabSize    = 32000
)

// AppendTokens appends the token ids of text to dst and returns the extended slice.
//
// Text is cut left to right into pieces: a run of whitespace belongs to the word after it, and a
// piece is at most 4 bytes, so "hello world" becomes "hell", "o", " wor", "ld". A piece's id is
// 100 + FNV-1a(piece) mod 32000. The cut never looks past the byte after a piece, so the tokens
// of a text prefix that ends on a piece boundary are a prefix of the text's tokens. English
// comes out at roughly one token per 3-4 bytes.
//
// It does not keep text or dst. It is safe for concurrent use.
func AppendTokens(dst []uint32, text []byte) []uint32 {
	i := 0
	for i < len(text) {
		start := i
		word := false
		for i < len(text) && i-start < 4 {
			if isSpace(text[i]) {
				if word {
					break
				}
			} else {
				word = true
			}
			i++
		}
		dst = append(dst, pieceID(text[start:i]))
	}
	return dst
}

// pieceID returns the id of one piece: FNV-1a 32 folded into the vocabulary.
func pieceID(p []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range p {
		h ^= uint32(c)
		h *= 16777619
	}
	return firstPieceID + h%vocabSize
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'
}

var roleAssistant = []byte("assistant")

// AppendChatTokens appends the token ids of a chat conversation to dst and returns the extended
// slice. Each message is <im_start> role <role_end> content <im_end> (markers are single
// reserved ids), and addGenerationPrompt appends <im_start> "assistant" <role_end>. The
// generation prompt equals the start of an assistant message, so the tokens of one turn (with
// the generation prompt) are a prefix of the next turn's tokens once the reply and a new user
// message are appended.
//
// messages holds {role, content} pairs; nothing is kept. It is safe for concurrent use.
func AppendChatTokens(dst []uint32, messages [][2][]byte, addGenerationPrompt bool) []uint32 {
	for i := range messages {
		dst = appendMessageTokens(dst, messages[i][0], messages[i][1])
	}
	if addGenerationPrompt {
		dst = appendGenerationPrompt(dst)
	}
	return dst
}

func appendMessageTokens(dst []uint32, role, content []byte) []uint32 {
	dst = append(dst, tokenIMStart)
	dst = AppendTokens(dst, role)
	dst = append(dst, tokenRoleEnd)
	dst = AppendTokens(dst, content)
	return append(dst, tokenIMEnd)
}

func appendGenerationPrompt(dst []uint32) []uint32 {
	dst = append(dst, tokenIMStart)
	dst = AppendTokens(dst, roleAssistant)
	return append(dst, tokenRoleEnd)
}

// fillerWords are the output "tokens". Each is at most 4 bytes with its leading space, so each
// is exactly one token of AppendTokens.
var fillerWords = [...]string{
	" the", " sim", " is", " a", " kv", " fake", " llm", " and", " it", " says",
	" hi", " to", " you", " ok", " yes", " so",
}

// fillerWord returns output token i of every response.
func fillerWord(i int) string {
	return fillerWords[i%len(fillerWords)]
}
