package sim

import (
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

// Test vectors of docs/internals/test-vectors.md (derived with python3-msgpack, which makes
// msgspec's byte choices).
const (
	tv2 = "92cb41d954fc402000009396ab426c6f636b53746f726564912ac092010202c092ac426c6f636b52656d6f766564912a" +
		"91b0416c6c426c6f636b73436c6561726564"
	tv3 = "93cb41d954fc402000009398ab426c6f636b53746f726564912ac092010202c0a3475055c093ac426c6f636b52656d6f" +
		"766564912aa347505591b0416c6c426c6f636b73436c656172656400"
	tv4 = "93cb41d954fc40200000939cab426c6f636b53746f726564912ac092010202c0a3475055c091c000ae66756c6c5f6174" +
		"74656e74696f6ec094ac426c6f636b52656d6f766564912aa34750550091b0416c6c426c6f636b73436c656172656400"
	tv5 = "93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573912ab1706172" +
		"656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964" +
		"c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b2" +
		"6b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d" +
		"6f766564ac626c6f636b5f686173686573912aa66d656469756da3475055a967726f75705f6964780081a474797065b0" +
		"416c6c426c6f636b73436c656172656400"
	tvMinimalMap = "93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573912ab1706172" +
		"656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964" +
		"c0a66d656469756da3475055a96c6f72615f6e616d65c000"
	tv6BytesRemoved = "83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d" +
		"0e0f101112131415161718191a1b1c1d1e1fa66d656469756da3475055"
	tv7Batch = "93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf26470bbe" +
		"c927f5bfb1706172656e745f626c6f636b5f68617368cf2ceabcfae6d332eaa9746f6b656e5f696473dc001011121314" +
		"15161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72" +
		"615f6e616d65c000"
	tvTS = 1700000000.5
)

// intHash returns a digest whose wire int is v.
func intHash(v uint64) blockHash {
	var h blockHash
	binary.BigEndian.PutUint64(h[24:], v)
	return h
}

func TestEncodeEraVectors(t *testing.T) {
	f := func(era Era, wantHex string) {
		t.Helper()
		h := []blockHash{intHash(42)}
		var events []byte
		events = appendBlockStored(events, eraFormats[era], HashInt, &storedEvent{hashes: h, tokens: []uint32{1, 2}, blockSize: 2})
		events = appendBlockRemoved(events, eraFormats[era], HashInt, h)
		events = appendAllBlocksCleared(events, eraFormats[era])
		got := hex.EncodeToString(appendBatch(nil, eraFormats[era], tvTS, events, 3, 0))
		if got != wantHex {
			t.Fatalf("era %s:\ngot  %s\nwant %s", era, got, wantHex)
		}
	}
	f(EraV08, tv2)
	f(EraLoraName, tv3)
	f(EraPositional, tv4)
	f(EraMap, tv5)
}

func TestEncodeMinimalMapBatch(t *testing.T) {
	ev := appendBlockStored(nil, eraFormats[EraMapMinimal], HashInt,
		&storedEvent{hashes: []blockHash{intHash(42)}, tokens: []uint32{1, 2}, blockSize: 2})
	got := hex.EncodeToString(appendBatch(nil, eraFormats[EraMapMinimal], tvTS, ev, 1, 0))
	if got != tvMinimalMap {
		t.Fatalf("got  %s\nwant %s", got, tvMinimalMap)
	}
}

func TestEncodeTV6(t *testing.T) {
	fHash := func(v uint64, wantHex string) {
		t.Helper()
		h := intHash(v)
		if got := hex.EncodeToString(appendHash(nil, HashInt, &h)); got != wantHex {
			t.Fatalf("hash %d: got %s, want %s", v, got, wantHex)
		}
	}
	fHash(1311768467463790320, "cf123456789abcdef0")
	fHash(15760518052499183552, "cfdab89baa7b5857c0")
	fHash(42, "2a")
	fHash(200, "ccc8")
	fHash(70000, "ce00011170")

	fInt := func(v int64, wantHex string) {
		t.Helper()
		if got := hex.EncodeToString(appendInt(nil, v)); got != wantHex {
			t.Fatalf("int %d: got %s, want %s", v, got, wantHex)
		}
	}
	fInt(-5, "fb")
	fInt(-1000, "d1fc18")
	fInt(0, "00")
	fInt(300, "cd012c")

	var h blockHash
	for i := range h {
		h[i] = byte(i)
	}
	got := hex.EncodeToString(appendBlockRemoved(nil, eraFormats[EraMapMinimal], HashBytes, []blockHash{h}))
	if got != tv6BytesRemoved {
		t.Fatalf("bytes BlockRemoved:\ngot  %s\nwant %s", got, tv6BytesRemoved)
	}
}

func TestEncodeTV7Batch(t *testing.T) {
	tokens := make([]uint32, 32)
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	hashes, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	ev := appendBlockStored(nil, eraFormats[EraMapMinimal], HashInt,
		&storedEvent{hashes: hashes[1:], parent: &hashes[0], tokens: tokens[16:], blockSize: 16})
	got := hex.EncodeToString(appendBatch(nil, eraFormats[EraMapMinimal], tvTS, ev, 1, 0))
	if got != tv7Batch {
		t.Fatalf("got  %s\nwant %s", got, tv7Batch)
	}
}

func TestMapHeaderDeclared16(t *testing.T) {
	f := func(n, declared int, want string) {
		t.Helper()
		if got := hex.EncodeToString(appendMapHeader(nil, n, declared)); got != want {
			t.Fatalf("appendMapHeader(%d, %d) = %s, want %s", n, declared, got, want)
		}
	}
	f(11, 12, "8b")
	f(15, 15, "8f")
	f(12, 16, "de000c")
	f(3, 20, "de0003")
}

func TestSeqFrame(t *testing.T) {
	f := func(seq uint64, want string) {
		t.Helper()
		if got := hex.EncodeToString(appendSeq(nil, seq)); got != want {
			t.Fatalf("seq %d: got %s, want %s", seq, got, want)
		}
	}
	f(0, "0000000000000000")
	f(1, "0000000000000001")
	f(258, "0000000000000102")
}

func TestEraNames(t *testing.T) {
	for e := Era(0); e < eraCount; e++ {
		got, err := ParseEra(e.String())
		if err != nil || got != e {
			t.Fatalf("ParseEra(%q) = %v, %v", e.String(), got, err)
		}
	}
	if _, err := ParseEra("bogus"); err == nil || !strings.Contains(err.Error(), "positional") {
		t.Fatalf("ParseEra(bogus) error = %v", err)
	}
	// Positional lengths of each era (docs/internals/vllm-kv-events.md).
	f := func(e Era, stored, removed int) {
		t.Helper()
		h := []blockHash{intHash(1)}
		b := appendBlockStored(nil, eraFormats[e], HashInt, &storedEvent{hashes: h, tokens: []uint32{1}, blockSize: 1})
		if int(b[0]-0x90) != stored {
			t.Fatalf("era %s: BlockStored has %d elements, want %d", e, b[0]-0x90, stored)
		}
		b = appendBlockRemoved(nil, eraFormats[e], HashInt, h)
		if int(b[0]-0x90) != removed {
			t.Fatalf("era %s: BlockRemoved has %d elements, want %d", e, b[0]-0x90, removed)
		}
	}
	f(EraV08, 6, 2)
	f(EraDPRank, 6, 2)
	f(EraMedium, 7, 3)
	f(EraLoraName, 8, 3)
	f(EraExtraKeys, 9, 3)
	f(EraGroupIdx, 10, 4)
	f(EraPositional, 12, 4)
}
