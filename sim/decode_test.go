package sim

import (
	"encoding/binary"
	"fmt"

	"github.com/tinylib/msgp/msgp"
)

// A small independent decoder of vLLM event batches for the tests: positional or map events,
// int or bin hashes (bin folded to its last 8 bytes, as llm-d does).

type testEvent struct {
	typ       string
	hashes    []uint64
	parent    *uint64
	tokens    []uint32
	blockSize int
	medium    string
}

type testBatch struct {
	ts     float64
	events []testEvent
	rank   int
}

func decodeBatch(b []byte) (testBatch, error) {
	var out testBatch
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n < 2 || n > 3 {
		return out, fmt.Errorf("batch header %d: %v", n, err)
	}
	if out.ts, b, err = msgp.ReadFloat64Bytes(b); err != nil {
		return out, err
	}
	ne, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return out, err
	}
	for range ne {
		var ev testEvent
		if ev, b, err = decodeEvent(b); err != nil {
			return out, err
		}
		out.events = append(out.events, ev)
	}
	if n == 3 {
		var r int64
		if r, b, err = msgp.ReadInt64Bytes(b); err != nil {
			return out, err
		}
		out.rank = int(r)
	}
	if len(b) != 0 {
		return out, fmt.Errorf("%d bytes after the batch", len(b))
	}
	return out, nil
}

func readHash(b []byte) (uint64, []byte, error) {
	if msgp.NextType(b) == msgp.BinType {
		h, rest, err := msgp.ReadBytesZC(b)
		if err != nil || len(h) < 8 {
			return 0, rest, fmt.Errorf("bin hash of %d bytes: %v", len(h), err)
		}
		return binary.BigEndian.Uint64(h[len(h)-8:]), rest, nil
	}
	return msgp.ReadUint64Bytes(b)
}

func readHashes(b []byte) ([]uint64, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return nil, b, err
	}
	var hs []uint64
	for range n {
		var h uint64
		if h, b, err = readHash(b); err != nil {
			return nil, b, err
		}
		hs = append(hs, h)
	}
	return hs, b, nil
}

// decodeField reads the value of a named field into ev.
func decodeField(ev *testEvent, name string, b []byte) ([]byte, error) {
	var err error
	switch name {
	case "block_hashes":
		ev.hashes, b, err = readHashes(b)
	case "parent_block_hash":
		if msgp.IsNil(b) {
			b, err = msgp.ReadNilBytes(b)
		} else {
			var h uint64
			h, b, err = readHash(b)
			ev.parent = &h
		}
	case "token_ids":
		var n uint32
		n, b, err = msgp.ReadArrayHeaderBytes(b)
		for i := uint32(0); i < n && err == nil; i++ {
			var t uint32
			t, b, err = msgp.ReadUint32Bytes(b)
			ev.tokens = append(ev.tokens, t)
		}
	case "block_size":
		var n int
		n, b, err = msgp.ReadIntBytes(b)
		ev.blockSize = n
	case "medium":
		if msgp.IsNil(b) {
			b, err = msgp.ReadNilBytes(b)
		} else {
			ev.medium, b, err = msgp.ReadStringBytes(b)
		}
	default:
		b, err = msgp.Skip(b)
	}
	return b, err
}

var positionalFields = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func decodeEvent(b []byte) (testEvent, []byte, error) {
	var ev testEvent
	var err error
	if msgp.NextType(b) == msgp.MapType {
		var n uint32
		if n, b, err = msgp.ReadMapHeaderBytes(b); err != nil {
			return ev, b, err
		}
		for range n {
			var k string
			if k, b, err = msgp.ReadStringBytes(b); err != nil {
				return ev, b, err
			}
			if k == "type" {
				ev.typ, b, err = msgp.ReadStringBytes(b)
			} else {
				b, err = decodeField(&ev, k, b)
			}
			if err != nil {
				return ev, b, err
			}
		}
		return ev, b, nil
	}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n == 0 {
		return ev, b, fmt.Errorf("event header %d: %v", n, err)
	}
	if ev.typ, b, err = msgp.ReadStringBytes(b); err != nil {
		return ev, b, err
	}
	names, ok := positionalFields[ev.typ]
	if !ok {
		return ev, b, fmt.Errorf("unknown event %q", ev.typ)
	}
	for i := 1; i < int(n); i++ {
		name := ""
		if i-1 < len(names) {
			name = names[i-1]
		}
		if b, err = decodeField(&ev, name, b); err != nil {
			return ev, b, err
		}
	}
	return ev, b, nil
}
