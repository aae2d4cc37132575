// Package promptkey validates an LLM API request body and reads what routing needs from it in one pass: the
// model, the stream flag, the session (prompt_cache_key) and the prompt key - the conversation itself, the
// same for one conversation whichever of the chat, responses and messages shapes carries it
// (docs/architecture.md, "Prompt key").
//
// The Scanner accepts exactly the JSON that Python's json.loads accepts (vLLM's parser), builds no value
// tree and allocates nothing once its buffers are warm; limits.go holds the bounds it enforces, which the
// configuration checks [server] cache_key_fields against. It depends on nothing of the data plane.
package promptkey
