package disagg_test

import (
	"errors"
	"fmt"

	"github.com/rolter-ai/rolter/disagg"
)

// The engine's use for a vLLM fleet: splice the prefill suffix into the client's body, send it, take the
// params from the answer, splice them into the decode request.
func Example() {
	body := []byte(`{"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
	o, err := disagg.Scan(body)
	if err != nil {
		panic(err) // the engine answers 400
	}
	buf := make([]byte, 0, 1024)

	prefill := append(buf[:0], body[:o.End]...)
	prefill = disagg.AppendPrefill(prefill, o)
	prefill = append(prefill, body[o.End:]...)
	fmt.Printf("prefill: %s\n", prefill)

	answer := []byte(`{"id":"chatcmpl-1","choices":[],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}`)
	params, err := disagg.ParsePrefillAnswer(answer)
	if err != nil && !errors.Is(err, disagg.ErrNoKVTransferParams) {
		panic(err) // another prefill target
	}
	decode := append(buf[:0], body[:o.End]...)
	decode = disagg.AppendDecode(decode, o, params)
	decode = append(decode, body[o.End:]...)
	fmt.Printf("decode: %s\n", decode)
	// Output:
	// prefill: {"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true},"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null},"stream":false,"max_tokens":1,"stream_options":null}
	// decode: {"model":"llama","messages":[{"role":"user","content":"Hi"}],"stream":true,"stream_options":{"include_usage":true},"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":[1,2]}}
}

// For an SGLang fleet both requests are the same body, sent at once.
func ExampleAppendBootstrap() {
	body := []byte(`{"model":"llama","prompt":"Once"}`)
	o, err := disagg.Scan(body)
	if err != nil {
		panic(err)
	}
	b := append([]byte(nil), body[:o.End]...)
	b = disagg.AppendBootstrap(b, o, "10.0.3.17", 8998, 12345) // disagg.NewRoom() in the engine
	b = append(b, body[o.End:]...)
	fmt.Printf("%s\n", b)
	// Output:
	// {"model":"llama","prompt":"Once","bootstrap_host":"10.0.3.17","bootstrap_port":8998,"bootstrap_room":12345}
}
