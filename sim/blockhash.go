package sim

import (
	"crypto/sha256"
	"encoding/binary"
)

// blockHash is a vLLM block digest under prefix_caching_hash_algo=sha256_cbor
// (vllm/v1/core/kv_cache_utils.py; test vector TV7 in docs/internals/test-vectors.md).
type blockHash [sha256.Size]byte

// wireInt is the hash as vLLM sends it by default: int.from_bytes(digest, "big") & (2^64-1),
// i.e. the last 8 bytes big-endian (vllm/v1/core/kv_cache_utils.py maybe_convert_block_hash).
func (h *blockHash) wireInt() uint64 {
	return binary.BigEndian.Uint64(h[len(h)-8:])
}

// noneHash is the parent of the first block: sha256(cbor2.dumps("0")) because vLLM seeds it
// with PYTHONHASHSEED, and "0" is the value every pod of a cache-aware fleet must share.
var noneHash = blockHash(sha256.Sum256([]byte{0x61, '0'}))

// appendBlockHashes appends the chained hashes of every full block of tokens to dst:
// hash_i = sha256(cbor([hash_{i-1} as bytes, [tokens of block i], extra keys])) with canonical
// CBOR, as vLLM's hash_block_tokens does. The extra keys are None without a LoRA adapter, and
// [lora] with one: vLLM's _gen_lora_extra_hash_keys puts the adapter's name into every block's
// keys (vllm/v1/core/kv_cache_utils.py), so an adapter's blocks never match the base model's.
// Multimodal and cache-salt keys are not modelled.
//
// buf is scratch space (may be nil); the grown buffer is returned for reuse. Nothing is kept.
func appendBlockHashes(dst []blockHash, buf []byte, tokens []uint32, blockSize int, lora string) ([]blockHash, []byte) {
	parent := noneHash
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		buf = appendBlockCBOR(buf[:0], &parent, tokens[i:i+blockSize], lora)
		parent = sha256.Sum256(buf)
		dst = append(dst, parent)
	}
	return dst, buf
}

// appendBlockCBOR appends cbor2.dumps([parent, tokens, None], canonical=True), or
// [parent, tokens, [lora]] for a LoRA adapter's block.
func appendBlockCBOR(dst []byte, parent *blockHash, tokens []uint32, lora string) []byte {
	dst = append(dst, 0x83, 0x58, byte(len(parent))) // array(3), bytes(32)
	dst = append(dst, parent[:]...)
	dst = appendCBORHead(dst, 4, uint64(len(tokens)))
	for _, t := range tokens {
		dst = appendCBORHead(dst, 0, uint64(t))
	}
	if lora == "" {
		return append(dst, 0xf6) // None
	}
	dst = append(dst, 0x81) // array(1)
	dst = appendCBORHead(dst, 3, uint64(len(lora)))
	return append(dst, lora...)
}

// appendCBORHead appends a CBOR head of the given major type with the shortest argument.
func appendCBORHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= 0xff:
		return append(dst, m|24, byte(v))
	case v <= 0xffff:
		return append(dst, m|25, byte(v>>8), byte(v))
	case v <= 0xffffffff:
		return append(dst, m|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
	dst = append(dst, m|27)
	return binary.BigEndian.AppendUint64(dst, v)
}
