package kvindex

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// RootKey is the parent key of the first block of every sequence.
//
// Own keys never use vLLM's hashes: those depend on PYTHONHASHSEED, the hash algorithm and the vLLM
// version (vllm/v1/core/kv_cache_utils.py; docs/architecture.md, "KV-event path"); the token ids in every
// BlockStored event let us compute a key that is the same for every engine and for the request path.
const RootKey uint64 = 0x726f6c7465726b76 // "rolterkv"

// keyBufTokens is the number of tokens hashed per Digest.Write; it bounds the on-stack chunk buffer.
const keyBufTokens = 64

// keyHasher computes chained block keys. It is not safe for concurrent use.
type keyHasher struct {
	d   xxhash.Digest
	buf [8 + 4*keyBufTokens]byte
}

// next returns the key of block given its parent key:
// xxhash64(parent as 8 little-endian bytes ++ each token id as 4 little-endian bytes).
//
// The result 0 is replaced by 1, because 0 marks an empty slot in the index table.
func (kh *keyHasher) next(parent uint64, block []uint32) uint64 {
	kh.d.Reset()
	buf := kh.buf[:]
	binary.LittleEndian.PutUint64(buf, parent)
	n := 8
	for _, t := range block {
		if n == len(buf) {
			kh.d.Write(buf)
			n = 0
		}
		binary.LittleEndian.PutUint32(buf[n:], t)
		n += 4
	}
	kh.d.Write(buf[:n])
	k := kh.d.Sum64()
	if k == 0 {
		k = 1
	}
	return k
}

// BlockKeys appends to dst the own keys of the full blocks of tokens and returns the extended slice.
//
// key_0 chains from RootKey, key_i from key_{i-1}; a trailing partial block has no key. BlockKeys does not
// allocate when dst has capacity for len(tokens)/blockSize more keys. It is safe for concurrent use.
func BlockKeys(dst []uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	var kh keyHasher
	parent := RootKey
	for len(tokens) >= blockSize {
		parent = kh.next(parent, tokens[:blockSize])
		dst = append(dst, parent)
		tokens = tokens[blockSize:]
	}
	return dst
}
