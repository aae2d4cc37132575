package sim

import (
	"encoding/binary"

	"github.com/tinylib/msgp/msgp"
)

// The KV event encoder. It writes what msgspec writes for vLLM's structs (jcrist/msgspec
// src/msgspec/_core.c; docs/internals/vllm-kv-events.md): the
// batch is always a positional array; events are tagged arrays carrying every field of their
// era, or tagged maps that always carry the fields without defaults and skip defaulted fields
// equal to their default (nil). Ints take the smallest form, non-negative ones unsigned; floats
// are float64.

// format lists which fields an era's structs declare.
type format struct {
	maps      bool // tagged maps (vLLM PR #42892) instead of tagged arrays
	batchRank bool // EventBatch.data_parallel_rank (vLLM PR #18925)
	medium    bool // medium (vLLM PR #19737)
	loraName  bool // lora_name (vLLM PR #27577)
	extraKeys bool // extra_keys (vLLM PR #33304), defaults to nil
	groupIdx  bool // group_idx (vLLM PR #37688), defaults to nil
	specKind  bool // kv_cache_spec_kind, kv_cache_spec_sliding_window (vLLM PR #40984), default nil
}

var eraFormats = [eraCount]format{
	EraMap:        {maps: true, batchRank: true, medium: true, loraName: true, extraKeys: true, groupIdx: true, specKind: true},
	EraMapMinimal: {maps: true, batchRank: true, medium: true, loraName: true},
	EraPositional: {batchRank: true, medium: true, loraName: true, extraKeys: true, groupIdx: true, specKind: true},
	EraGroupIdx:   {batchRank: true, medium: true, loraName: true, extraKeys: true, groupIdx: true},
	EraExtraKeys:  {batchRank: true, medium: true, loraName: true, extraKeys: true},
	EraLoraName:   {batchRank: true, medium: true, loraName: true},
	EraMedium:     {batchRank: true, medium: true},
	EraDPRank:     {batchRank: true},
	EraV08:        {},
}

// The sim has one KV cache group of full attention on the GPU.
const (
	eventMedium   = "GPU"
	eventSpecKind = "full_attention"
	eventGroupIdx = 0
)

// storedEvent is one BlockStored: blocks hashes[i] with tokens[i*blockSize:(i+1)*blockSize].
type storedEvent struct {
	hashes    []blockHash
	parent    *blockHash // nil for the first block of a sequence
	tokens    []uint32
	blockSize int
	loraID    int    // 0: the base model (lora_id and lora_name nil)
	loraName  string // the adapter's name, also each block's extra key
}

// appendBlockStored appends one BlockStored event to dst.
//
// The event does not keep ev. The function is safe for concurrent use.
func appendBlockStored(dst []byte, f format, mode HashMode, ev *storedEvent) []byte {
	if f.maps {
		// Fields without defaults (type, block_hashes … lora_name) are always written; the
		// defaulted ones are written because the sim's values are not nil, except
		// kv_cache_spec_sliding_window, which is nil and so omitted from a map.
		n := declaredStored(f)
		if f.specKind {
			n--
		}
		dst = appendMapHeader(dst, n, declaredStored(f))
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, "BlockStored")
		dst = msgp.AppendString(dst, "block_hashes")
		dst = appendHashes(dst, mode, ev.hashes)
		dst = msgp.AppendString(dst, "parent_block_hash")
		dst = appendParent(dst, mode, ev.parent)
		dst = msgp.AppendString(dst, "token_ids")
		dst = appendTokens(dst, ev.tokens)
		dst = msgp.AppendString(dst, "block_size")
		dst = appendInt(dst, int64(ev.blockSize))
		dst = msgp.AppendString(dst, "lora_id")
		dst = appendLoRAID(dst, ev)
		if f.medium {
			dst = msgp.AppendString(dst, "medium")
			dst = msgp.AppendString(dst, eventMedium)
		}
		if f.loraName {
			dst = msgp.AppendString(dst, "lora_name")
			dst = appendLoRAName(dst, ev)
		}
		if f.extraKeys {
			dst = msgp.AppendString(dst, "extra_keys")
			dst = appendExtraKeys(dst, ev)
		}
		if f.groupIdx {
			dst = msgp.AppendString(dst, "group_idx")
			dst = appendInt(dst, eventGroupIdx)
		}
		if f.specKind {
			dst = msgp.AppendString(dst, "kv_cache_spec_kind")
			dst = msgp.AppendString(dst, eventSpecKind)
		}
		return dst
	}
	dst = msgp.AppendArrayHeader(dst, uint32(declaredStored(f)))
	dst = msgp.AppendString(dst, "BlockStored")
	dst = appendHashes(dst, mode, ev.hashes)
	dst = appendParent(dst, mode, ev.parent)
	dst = appendTokens(dst, ev.tokens)
	dst = appendInt(dst, int64(ev.blockSize))
	dst = appendLoRAID(dst, ev)
	if f.medium {
		dst = msgp.AppendString(dst, eventMedium)
	}
	if f.loraName {
		dst = appendLoRAName(dst, ev)
	}
	if f.extraKeys {
		dst = appendExtraKeys(dst, ev)
	}
	if f.groupIdx {
		dst = appendInt(dst, eventGroupIdx)
	}
	if f.specKind {
		dst = msgp.AppendString(dst, eventSpecKind)
		dst = msgp.AppendNil(dst) // kv_cache_spec_sliding_window
	}
	return dst
}

// declaredStored is the number of BlockStored fields plus the tag.
func declaredStored(f format) int {
	n := 6 // tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id
	if f.medium {
		n++
	}
	if f.loraName {
		n++
	}
	if f.extraKeys {
		n++
	}
	if f.groupIdx {
		n++
	}
	if f.specKind {
		n += 2
	}
	return n
}

// appendBlockRemoved appends one BlockRemoved event for hashes to dst.
func appendBlockRemoved(dst []byte, f format, mode HashMode, hashes []blockHash) []byte {
	n := 2 // tag, block_hashes
	if f.medium {
		n++
	}
	if f.groupIdx {
		n++
	}
	if f.maps {
		dst = appendMapHeader(dst, n, n)
		dst = msgp.AppendString(dst, "type")
		dst = msgp.AppendString(dst, "BlockRemoved")
		dst = msgp.AppendString(dst, "block_hashes")
		dst = appendHashes(dst, mode, hashes)
		if f.medium {
			dst = msgp.AppendString(dst, "medium")
			dst = msgp.AppendString(dst, eventMedium)
		}
		if f.groupIdx {
			dst = msgp.AppendString(dst, "group_idx")
			dst = appendInt(dst, eventGroupIdx)
		}
		return dst
	}
	dst = msgp.AppendArrayHeader(dst, uint32(n))
	dst = msgp.AppendString(dst, "BlockRemoved")
	dst = appendHashes(dst, mode, hashes)
	if f.medium {
		dst = msgp.AppendString(dst, eventMedium)
	}
	if f.groupIdx {
		dst = appendInt(dst, eventGroupIdx)
	}
	return dst
}

// appendAllBlocksCleared appends one AllBlocksCleared event to dst.
func appendAllBlocksCleared(dst []byte, f format) []byte {
	if f.maps {
		dst = msgp.AppendMapHeader(dst, 1)
		dst = msgp.AppendString(dst, "type")
		return msgp.AppendString(dst, "AllBlocksCleared")
	}
	dst = msgp.AppendArrayHeader(dst, 1)
	return msgp.AppendString(dst, "AllBlocksCleared")
}

// appendBatch appends the EventBatch [ts, events, data_parallel_rank] ([ts, events] before
// #18925) to dst; events holds n encoded events back to back.
func appendBatch(dst []byte, f format, ts float64, events []byte, n int, rank int) []byte {
	if f.batchRank {
		dst = msgp.AppendArrayHeader(dst, 3)
	} else {
		dst = msgp.AppendArrayHeader(dst, 2)
	}
	dst = msgp.AppendFloat64(dst, ts)
	dst = msgp.AppendArrayHeader(dst, uint32(n))
	dst = append(dst, events...)
	if f.batchRank {
		dst = appendInt(dst, int64(rank))
	}
	return dst
}

// appendSeq appends the 8-byte big-endian sequence frame.
func appendSeq(dst []byte, seq uint64) []byte {
	return binary.BigEndian.AppendUint64(dst, seq)
}

// appendMapHeader writes a map header the way msgspec does: it reserves the header for the
// declared field count and patches in the written count, so a struct declaring 16 or more
// fields gets a map16 header even when fewer are written (msgspec _core.c).
func appendMapHeader(dst []byte, n, declared int) []byte {
	if declared < 16 {
		return msgp.AppendMapHeader(dst, uint32(n))
	}
	return append(dst, 0xde, byte(n>>8), byte(n))
}

// appendInt appends i in msgspec's smallest form: unsigned encodings for non-negative values.
func appendInt(dst []byte, i int64) []byte {
	if i >= 0 {
		return msgp.AppendUint64(dst, uint64(i))
	}
	return msgp.AppendInt64(dst, i)
}

func appendHash(dst []byte, mode HashMode, h *blockHash) []byte {
	if mode == HashBytes {
		return msgp.AppendBytes(dst, h[:])
	}
	return msgp.AppendUint64(dst, h.wireInt())
}

func appendHashes(dst []byte, mode HashMode, hashes []blockHash) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(hashes)))
	for i := range hashes {
		dst = appendHash(dst, mode, &hashes[i])
	}
	return dst
}

func appendParent(dst []byte, mode HashMode, parent *blockHash) []byte {
	if parent == nil {
		return msgp.AppendNil(dst)
	}
	return appendHash(dst, mode, parent)
}

func appendTokens(dst []byte, tokens []uint32) []byte {
	dst = msgp.AppendArrayHeader(dst, uint32(len(tokens)))
	for _, t := range tokens {
		dst = msgp.AppendUint64(dst, uint64(t))
	}
	return dst
}

// appendExtraKeys appends extra_keys: per block nil for the base model, [lora_name] for an
// adapter's block (the keys its hash was made with; no multimodal or salt keys).
func appendExtraKeys(dst []byte, ev *storedEvent) []byte {
	n := len(ev.hashes)
	dst = msgp.AppendArrayHeader(dst, uint32(n))
	for range n {
		if ev.loraID == 0 {
			dst = msgp.AppendNil(dst)
			continue
		}
		dst = msgp.AppendArrayHeader(dst, 1)
		dst = msgp.AppendString(dst, ev.loraName)
	}
	return dst
}

// appendLoRAID appends lora_id: the adapter's lora_int_id, nil for the base model.
func appendLoRAID(dst []byte, ev *storedEvent) []byte {
	if ev.loraID == 0 {
		return msgp.AppendNil(dst)
	}
	return appendInt(dst, int64(ev.loraID))
}

// appendLoRAName appends lora_name: the adapter's name, nil for the base model.
func appendLoRAName(dst []byte, ev *storedEvent) []byte {
	if ev.loraID == 0 {
		return msgp.AppendNil(dst)
	}
	return msgp.AppendString(dst, ev.loraName)
}
