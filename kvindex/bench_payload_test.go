package kvindex

import (
	"github.com/tinylib/msgp/msgp"
)

// realisticBatch is one engine step as vLLM publishes it in the last positional era (12-element
// BlockStored, 4-element BlockRemoved) or the map era: 12 BlockStored events of 2 blocks of 16 tokens,
// each chained to the previous one (the first has no parent), and 4 single-block removals (the first
// names the last stored block) - 16 events, like llm-d-inference-sim's event-batch-size.
func realisticBatch(mapEvents bool) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1700000000.5)
	b = msgp.AppendArrayHeader(b, 16)
	h := uint64(0x8000_0000_0000_0000)
	tok := uint32(100_000)
	for i := 0; i < 12; i++ {
		hashes := []uint64{h + 1, h + 2}
		tokens := make([]uint32, 32)
		for j := range tokens {
			tokens[j] = tok
			tok += 7919
		}
		if mapEvents {
			b = msgp.AppendMapHeader(b, 11)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockStored")
			b = msgp.AppendString(b, "block_hashes")
			b = appendHashes(b, hashes)
			b = msgp.AppendString(b, "parent_block_hash")
			b = appendParent(b, i, h)
			b = msgp.AppendString(b, "token_ids")
			b = appendTokens(b, tokens)
			b = msgp.AppendString(b, "block_size")
			b = msgp.AppendInt(b, 16)
			b = msgp.AppendString(b, "lora_id")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, "GPU")
			b = msgp.AppendString(b, "lora_name")
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "extra_keys")
			b = msgp.AppendArrayHeader(b, 2)
			b = msgp.AppendNil(b)
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "group_idx")
			b = msgp.AppendInt(b, 0)
			b = msgp.AppendString(b, "kv_cache_spec_kind")
			b = msgp.AppendString(b, "full_attention")
		} else {
			b = msgp.AppendArrayHeader(b, 12)
			b = msgp.AppendString(b, "BlockStored")
			b = appendHashes(b, hashes)
			b = appendParent(b, i, h)
			b = appendTokens(b, tokens)
			b = msgp.AppendInt(b, 16)
			b = msgp.AppendNil(b)
			b = msgp.AppendString(b, "GPU")
			b = msgp.AppendNil(b)
			b = msgp.AppendArrayHeader(b, 2)
			b = msgp.AppendNil(b)
			b = msgp.AppendNil(b)
			b = msgp.AppendInt(b, 0)
			b = msgp.AppendString(b, "full_attention")
			b = msgp.AppendNil(b)
		}
		h += 2
	}
	for i := 0; i < 4; i++ {
		if mapEvents {
			b = msgp.AppendMapHeader(b, 4)
			b = msgp.AppendString(b, "type")
			b = msgp.AppendString(b, "BlockRemoved")
			b = msgp.AppendString(b, "block_hashes")
			b = appendHashes(b, []uint64{h + uint64(i)})
			b = msgp.AppendString(b, "medium")
			b = msgp.AppendString(b, "GPU")
			b = msgp.AppendString(b, "group_idx")
			b = msgp.AppendInt(b, 0)
		} else {
			b = msgp.AppendArrayHeader(b, 4)
			b = msgp.AppendString(b, "BlockRemoved")
			b = appendHashes(b, []uint64{h + uint64(i)})
			b = msgp.AppendString(b, "GPU")
			b = msgp.AppendInt(b, 0)
		}
	}
	return msgp.AppendInt(b, 0)
}

func appendParent(b []byte, i int, h uint64) []byte {
	if i == 0 {
		return msgp.AppendNil(b)
	}
	return msgp.AppendUint64(b, h)
}
