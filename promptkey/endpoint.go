package promptkey

// Endpoint is a data-plane API: which body shape the scanner reads a prompt key from.
type Endpoint uint8

const (
	Chat Endpoint = iota
	Completions
	Embeddings
	Responses // OpenAI's Responses API
	Messages  // Anthropic-style Messages API, which vLLM serves too
	Other     // any other POST /v1/* JSON body: routed by its model, on an empty prompt key
	NumEndpoints
)

// paths are the request paths of the endpoints, for messages and span names.
var paths = [NumEndpoints]string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
	"/v1/messages", "/v1/*"}

// Path returns the endpoint's request path, "/v1/*" for Other.
func (e Endpoint) Path() string { return paths[e] }

// noField is a top-level key no body has - keys are valid UTF-8 and it is not -, for an endpoint without
// the field.
const noField = "\xff"

// promptField is the top-level key holding the prompt of each endpoint, and systemField the one holding its
// system message, for the endpoints that have it apart from the messages.
var (
	promptField = [NumEndpoints]string{Chat: "messages", Completions: "prompt", Embeddings: "input",
		Responses: "input", Messages: "messages", Other: noField}
	systemField = [NumEndpoints]string{Chat: noField, Completions: noField, Embeddings: noField,
		Responses: "instructions", Messages: "system", Other: noField}
)
