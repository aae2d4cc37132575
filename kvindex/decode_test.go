package kvindex

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

const (
	tv2Stored      = "stored h=[42] p=- t=[1 2] bs=2 lora=-/- m=- g=- kind=- w=-"
	tv3Stored      = "stored h=[42] p=- t=[1 2] bs=2 lora=-/- m=GPU g=- kind=- w=-"
	tv4Stored      = "stored h=[42] p=- t=[1 2] bs=2 lora=-/- m=GPU g=0 kind=full_attention w=-"
	removedNil     = "removed h=[42] m=- g=-"
	removedGPU     = "removed h=[42] m=GPU g=-"
	removedGroup0  = "removed h=[42] m=GPU g=0"
	clearedLine    = "cleared"
	tsTestVectors  = 1700000000.5
	tv7Parent      = "3236607068019569386"
	tv7Hash        = "2758186210834249151"
	tv7TokenString = "[17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32]"
)

func TestDecodeVectors(t *testing.T) {
	f := func(name string, payload []byte, wantBatch Batch, want ...string) {
		t.Helper()
		var d Decoder
		var r recorder
		bt, err := d.Decode(payload, &r)
		if err != nil {
			t.Fatalf("%s: unexpected error: %s", name, err)
		}
		if bt != wantBatch {
			t.Fatalf("%s: unexpected batch\ngot  %+v\nwant %+v", name, bt, wantBatch)
		}
		if !reflect.DeepEqual(r.lines, want) {
			t.Fatalf("%s: unexpected events\ngot  %q\nwant %q", name, r.lines, want)
		}
	}
	noRank := Batch{TS: tsTestVectors, Events: 3}
	rank0 := Batch{TS: tsTestVectors, HasRank: true, Events: 3}
	one := Batch{TS: tsTestVectors, HasRank: true, Events: 1}

	f("TV2 oldest positional", mustHex(t, hexTV2), noRank, tv2Stored, removedNil, clearedLine)
	f("TV3 medium+lora_name", mustHex(t, hexTV3), rank0, tv3Stored, removedGPU, clearedLine)
	f("TV4 last positional", mustHex(t, hexTV4), rank0, tv4Stored, removedGroup0, clearedLine)
	f("TV5 map era", mustHex(t, hexTV5), rank0, tv4Stored, removedGroup0, clearedLine)
	f("minimal map", mustHex(t, hexMinimalMap), one, tv3Stored)
	f("TV6 bin hash", wrap(t, hexTV6BinRemoved), one, "removed h=[1736447835066146335] m=GPU g=-")
	f("TV6 uint64 and negative hashes",
		wrap(t, "93ac426c6f636b52656d6f76656494cf123456789abcdef0cfdab89baa7b5857c0fbd1fc18a3475055"), one,
		"removed h=[1311768467463790320 15760518052499183552 18446744073709551611 18446744073709550616] m=GPU g=-")
	f("TV7 sha256_cbor chain", mustHex(t, hexTV7), one,
		"stored h=["+tv7Hash+"] p="+tv7Parent+" t="+tv7TokenString+" bs=16 lora=-/- m=GPU g=- kind=- w=-")
	f("captured llm-d-inference-sim removal", wrap(t, hexSimRemoved), one,
		"removed h=[4288763425284820871] m=GPU g=-")
}

func TestDecodeLLMDSimQuirks(t *testing.T) {
	f := func(name, evHex string, want string) {
		t.Helper()
		var d Decoder
		var r recorder
		if _, err := d.Decode(wrap(t, evHex), &r); err != nil {
			t.Fatalf("%s: unexpected error: %s", name, err)
		}
		if len(r.lines) != 1 || r.lines[0] != want {
			t.Fatalf("%s: unexpected events\ngot  %q\nwant %q", name, r.lines, want)
		}
	}
	// 9-element positional BlockStored (tag..extra_keys), 0xcf hashes, parent 0 as 0xcf, 0xce tokens,
	// lower-case medium as in llm-d's own tests.
	f("positional 9",
		"99ab426c6f636b53746f72656492cf8000000000000001cf0000000000000002cf0000000000000000"+
			"94ce00000001ce00000002ce00000003ce0000000402c0a3677075c0c0",
		"stored h=[9223372036854775809 2] p=- t=[1 2 3 4] bs=2 lora=-/- m=gpu g=- kind=- w=-")
	// Parent 0 as positive fixint.
	f("parent fixint 0",
		"99ab426c6f636b53746f72656491cf00000000000000050092010202c0a3475055c0c0",
		"stored h=[5] p=- t=[1 2] bs=2 lora=-/- m=GPU g=- kind=- w=-")
	// Map mode without lora_id/lora_name (the sim omits nil values vLLM always writes).
	f("map without lora keys",
		"86a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf0000000000000007"+
			"b1706172656e745f626c6f636b5f68617368cf0000000000000006a9746f6b656e5f69647392ce00000001ce00000002"+
			"aa626c6f636b5f73697a6502a66d656469756da3475055",
		"stored h=[7] p=6 t=[1 2] bs=2 lora=-/- m=GPU g=- kind=- w=-")
}

func TestDecodeShapes(t *testing.T) {
	f := func(name string, payload []byte, wantBatch Batch, want ...string) {
		t.Helper()
		var d Decoder
		var r recorder
		bt, err := d.Decode(payload, &r)
		if err != nil {
			t.Fatalf("%s: unexpected error: %s", name, err)
		}
		if bt != wantBatch {
			t.Fatalf("%s: unexpected batch\ngot  %+v\nwant %+v", name, bt, wantBatch)
		}
		if !reflect.DeepEqual(r.lines, want) {
			t.Fatalf("%s: unexpected events\ngot  %q\nwant %q", name, r.lines, want)
		}
	}

	// Map-shaped batch, keys in an unusual order, an unknown key, a nil rank.
	b := msgp.AppendMapHeader(nil, 4)
	b = msgp.AppendString(b, "events")
	b = msgp.AppendArrayHeader(b, 1)
	b = append(b, clearedEvent()...)
	b = msgp.AppendString(b, "future")
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendString(b, "x")
	b = msgp.AppendMapHeader(b, 0)
	b = msgp.AppendString(b, "data_parallel_rank")
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "ts")
	b = msgp.AppendFloat64(b, 2.5)
	f("map batch", b, Batch{TS: 2.5, Events: 1}, clearedLine)

	// Rank 3 as a batch field, and unknown trailing batch fields.
	b = msgp.AppendArrayHeader(nil, 5)
	b = msgp.AppendFloat32(b, 1.5)
	b = msgp.AppendArrayHeader(b, 0)
	b = msgp.AppendInt(b, 3)
	b = msgp.AppendString(b, "later")
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendNil(b)
	f("rank and trailing batch fields", b, Batch{TS: 1.5, DPRank: 3, HasRank: true})

	// Unknown event types (positional and map), a map event without "type", unknown keys and unknown
	// trailing positional fields.
	unknownArr := msgp.AppendArrayHeader(nil, 3)
	unknownArr = msgp.AppendString(unknownArr, "BlockPinned")
	unknownArr = appendHashes(unknownArr, []uint64{1, 2})
	unknownArr = msgp.AppendMapHeader(unknownArr, 0)
	unknownMap := msgp.AppendMapHeader(nil, 2)
	unknownMap = msgp.AppendString(unknownMap, "block_hashes")
	unknownMap = appendHashes(unknownMap, []uint64{9})
	unknownMap = msgp.AppendString(unknownMap, "type")
	unknownMap = msgp.AppendString(unknownMap, "Future")
	noType := msgp.AppendMapHeader(nil, 1)
	noType = msgp.AppendString(noType, "block_hashes")
	noType = appendHashes(noType, []uint64{8})

	longStored := msgp.AppendArrayHeader(nil, 14)
	longStored = msgp.AppendString(longStored, "BlockStored")
	longStored = appendHashes(longStored, []uint64{11})
	longStored = msgp.AppendUint64(longStored, 10)
	longStored = appendTokens(longStored, []uint32{5, 6})
	longStored = msgp.AppendInt(longStored, 2)
	longStored = msgp.AppendInt(longStored, 7)         // lora_id
	longStored = msgp.AppendString(longStored, "CPU")  // medium
	longStored = msgp.AppendString(longStored, "sql")  // lora_name
	longStored = msgp.AppendArrayHeader(longStored, 1) // extra_keys
	longStored = msgp.AppendArrayHeader(longStored, 2) //   [["uuid", "salt"]]
	longStored = msgp.AppendString(longStored, "uuid") //
	longStored = msgp.AppendString(longStored, "salt") //
	longStored = msgp.AppendInt(longStored, 1)         // group_idx
	longStored = msgp.AppendString(longStored, "sliding_window")
	longStored = msgp.AppendInt(longStored, 128)        // window
	longStored = msgp.AppendString(longStored, "LOCAL") // locality (newer)
	longStored = msgp.AppendNil(longStored)             // ownership (newer)

	longRemoved := msgp.AppendArrayHeader(nil, 6)
	longRemoved = msgp.AppendString(longRemoved, "BlockRemoved")
	longRemoved = appendHashes(longRemoved, []uint64{11})
	longRemoved = msgp.AppendNil(longRemoved)
	longRemoved = msgp.AppendInt(longRemoved, 2)
	longRemoved = msgp.AppendString(longRemoved, "REMOTE")
	longRemoved = msgp.AppendNil(longRemoved)

	mapStored := msgp.AppendMapHeader(nil, 7)
	mapStored = msgp.AppendString(mapStored, "token_ids")
	mapStored = appendTokens(mapStored, []uint32{70000, 3})
	mapStored = msgp.AppendString(mapStored, "locality")
	mapStored = msgp.AppendString(mapStored, "LOCAL")
	mapStored = msgp.AppendString(mapStored, "block_size")
	mapStored = msgp.AppendInt(mapStored, 2)
	mapStored = msgp.AppendString(mapStored, "block_hashes")
	mapStored = appendHashes(mapStored, []uint64{12})
	mapStored = msgp.AppendString(mapStored, "parent_block_hash")
	mapStored = msgp.AppendBytes(mapStored, []byte{0xaa, 0x01, 0x02}) // short bin parent, left-padded
	mapStored = msgp.AppendString(mapStored, "type")
	mapStored = msgp.AppendString(mapStored, "BlockStored")
	mapStored = msgp.AppendString(mapStored, "lora_name")
	mapStored = msgp.AppendString(mapStored, "adapter")

	f("unknown types, keys and fields", batchOf(unknownArr, longStored, unknownMap, noType, longRemoved, mapStored),
		Batch{TS: tsTestVectors, HasRank: true, Events: 3, Skipped: 3},
		"stored h=[11] p=10 t=[5 6] bs=2 lora=7/sql m=CPU g=1 kind=sliding_window w=128",
		"removed h=[11] m=- g=2",
		"stored h=[12] p=11141378 t=[70000 3] bs=2 lora=-/adapter m=- g=- kind=- w=-")

	// The unverified event_version variant shifts extra_keys and later fields; they are skipped as absent.
	shifted := msgp.AppendArrayHeader(nil, 11)
	shifted = msgp.AppendString(shifted, "BlockStored")
	shifted = appendHashes(shifted, []uint64{1})
	shifted = msgp.AppendNil(shifted)
	shifted = appendTokens(shifted, []uint32{1})
	shifted = msgp.AppendInt(shifted, 1)
	shifted = msgp.AppendNil(shifted)
	shifted = msgp.AppendString(shifted, "GPU")
	shifted = msgp.AppendNil(shifted)
	shifted = msgp.AppendInt(shifted, 1)         // event_version at the extra_keys position
	shifted = msgp.AppendArrayHeader(shifted, 0) // extra_keys at the group_idx position
	shifted = msgp.AppendInt(shifted, 0)         // group_idx at the spec kind position
	f("shifted optional fields", batchOf(shifted), Batch{TS: tsTestVectors, HasRank: true, Events: 1},
		"stored h=[1] p=- t=[1] bs=1 lora=-/- m=GPU g=- kind=- w=-")

	// A batch with nil events and an empty events list.
	f("nil events", mustHex(t, "93cb41d954fc40200000c000"), Batch{TS: tsTestVectors, HasRank: true})
	f("no events", mustHex(t, "92cb41d954fc4020000090"), Batch{TS: tsTestVectors})
}

func TestDecodeErrors(t *testing.T) {
	f := func(name string, payload []byte) {
		t.Helper()
		var d Decoder
		var r recorder
		_, err := d.Decode(payload, &r)
		if err == nil {
			t.Fatalf("%s: expected an error for %x", name, payload)
		}
		if !errors.Is(err, errMalformed) || !strings.HasPrefix(err.Error(), "cannot decode kv event batch: ") {
			t.Fatalf("%s: unexpected error shape: %s", name, err)
		}
		if len(r.lines) != 0 {
			t.Fatalf("%s: a malformed batch delivered events: %q", name, r.lines)
		}
	}
	f("empty", nil)
	f("invalid prefix", mustHex(t, "c1"))
	f("batch is an int", mustHex(t, "05"))
	f("batch of one element", mustHex(t, "91cb41d954fc40200000"))
	f("ts is a string", mustHex(t, "92a17890"))
	f("events is an int", mustHex(t, "92cb41d954fc4020000005"))
	f("events header claims 2^32-1", mustHex(t, "93cb41d954fc40200000ddffffffff00"))
	f("event map header claims 2^32-1", mustHex(t, "93cb41d954fc4020000091dfffffffff00"))
	f("hashes header claims 65535", wrap(t, "92ac426c6f636b52656d6f766564dcffff2a"))
	f("event is an int", wrap(t, "2a"))
	f("empty event array", wrap(t, "90"))
	f("tag is not a string", wrap(t, "912a"))
	f("BlockStored with 3 fields", wrap(t, "94ab426c6f636b53746f726564912ac09101"))
	f("BlockRemoved without fields", wrap(t, "91ac426c6f636b52656d6f766564"))
	f("hash is a string", wrap(t, "92ac426c6f636b52656d6f76656491a13f"))
	f("hash is a float", wrap(t, "92ac426c6f636b52656d6f76656491cb41d954fc40200000"))
	f("token id above 2^32", wrap(t, "96ab426c6f636b53746f726564912ac091cf000000010000000001c0"))
	f("negative token id", wrap(t, "96ab426c6f636b53746f726564912ac091ff01c0"))
	f("negative block size", wrap(t, "96ab426c6f636b53746f726564912ac09101ffc0"))
	f("medium is an int", wrap(t, "93ac426c6f636b52656d6f766564912a07"))
	f("trailing bytes", append(mustHex(t, hexTV3), 0x00))
	f("map BlockStored without block_hashes", wrap(t, "83a474797065ab426c6f636b53746f726564a9746f6b656e5f69647390aa626c6f636b5f73697a6502"))
	f("map BlockRemoved without block_hashes", wrap(t, "81a474797065ac426c6f636b52656d6f766564"))
	f("map key is an int", wrap(t, "81012a"))
	f("map batch without events", mustHex(t, "81a27473cb41d954fc40200000"))
	f("rank is a string", mustHex(t, "93cb41d954fc4020000090a130"))
	f("deep nesting in an unknown field", wrap(t, "93ac426c6f636b52656d6f766564912a"+strings.Repeat("91", 200)))

	// Every strict prefix of a valid payload is truncated and must fail without delivering events.
	for _, v := range []string{hexTV2, hexTV3, hexTV4, hexTV5, hexMinimalMap, hexTV7} {
		full := mustHex(t, v)
		for n := 0; n < len(full); n++ {
			f("truncated", full[:n])
		}
	}
}

// TestDecodeCorruptedNoPanic flips bytes of every vector deterministically: the result may decode or not,
// but must never panic, and a failed decode must deliver nothing.
func TestDecodeCorruptedNoPanic(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var d Decoder
	for _, v := range seedPayloads(t) {
		for i := 0; i < 2000; i++ {
			p := append([]byte(nil), v...)
			for k := 0; k < 1+rng.IntN(3); k++ {
				p[rng.IntN(len(p))] = byte(rng.Uint32())
			}
			var r recorder
			if _, err := d.Decode(p, &r); err != nil && len(r.lines) != 0 {
				t.Fatalf("a failed decode delivered events: %x", p)
			}
		}
	}
}

func TestDecodeReuse(t *testing.T) {
	// One Decoder across batches of different sizes must not leak state between them.
	var d Decoder
	big := batchOf(storedEvent([]uint64{1, 2, 3}, 0, seqRange(1, 6), 2), removedEvent(1, 2, 3))
	for i := 0; i < 3; i++ {
		var r recorder
		if _, err := d.Decode(big, &r); err != nil {
			t.Fatalf("unexpected error: %s", err)
		}
		r = recorder{}
		if _, err := d.Decode(mustHex(t, hexTV3), &r); err != nil {
			t.Fatalf("unexpected error: %s", err)
		}
		if !reflect.DeepEqual(r.lines, []string{tv3Stored, removedGPU, clearedLine}) {
			t.Fatalf("unexpected events after reuse: %q", r.lines)
		}
	}
}

func seedPayloads(t testing.TB) [][]byte {
	t.Helper()
	return [][]byte{
		mustHex(t, hexTV2), mustHex(t, hexTV3), mustHex(t, hexTV4), mustHex(t, hexTV5),
		mustHex(t, hexMinimalMap), mustHex(t, hexTV7), wrap(t, hexTV6BinRemoved), wrap(t, hexSimRemoved),
		wrap(t, "93ac426c6f636b52656d6f76656494cf123456789abcdef0cfdab89baa7b5857c0fbd1fc18a3475055"),
	}
}

type countingHandler struct{ stored, removed, cleared int }

func (c *countingHandler) BlockStored(*BlockStored)   { c.stored++ }
func (c *countingHandler) BlockRemoved(*BlockRemoved) { c.removed++ }
func (c *countingHandler) AllBlocksCleared()          { c.cleared++ }

func FuzzDecode(f *testing.F) {
	for _, p := range seedPayloads(f) {
		f.Add(p)
	}
	var d Decoder
	f.Fuzz(func(t *testing.T, payload []byte) {
		var c countingHandler
		bt, err := d.Decode(payload, &c)
		got := c.stored + c.removed + c.cleared
		if err != nil {
			if got != 0 {
				t.Fatalf("a failed decode delivered %d events", got)
			}
			return
		}
		if got != bt.Events {
			t.Fatalf("delivered %d events; batch says %d", got, bt.Events)
		}
		// Decoding is deterministic (ts compared by bits: it may be NaN).
		var c2 countingHandler
		bt2, err := d.Decode(payload, &c2)
		sameTS := math.Float64bits(bt2.TS) == math.Float64bits(bt.TS)
		a, b := bt, bt2
		a.TS, b.TS = 0, 0
		if err != nil || !sameTS || a != b || c2 != c {
			t.Fatalf("second decode differs: %+v %v vs %+v", bt2, err, bt)
		}
	})
}

func TestDecodeTokensRunOut(t *testing.T) {
	// The header fits the bytes left, the wide elements do not.
	var d Decoder
	var r recorder
	if _, err := d.Decode(wrap(t, "96ab426c6f636b53746f726564912ac093ce00000001ce"), &r); err == nil {
		t.Fatalf("expected an error")
	}
}

// skipSamples encodes one value of every msgpack type and length class.
func skipSamples() [][]byte {
	var out [][]byte
	add := func(b []byte) { out = append(out, b) }
	add(msgp.AppendNil(nil))
	add(msgp.AppendBool(nil, true))
	for _, v := range []int64{0, 127, -1, -32, -33, 200, -200, 40000, -40000, 1 << 31, -(1 << 40), math.MinInt64} {
		add(msgp.AppendInt64(nil, v))
	}
	for _, v := range []uint64{0, 255, 65535, 1 << 32, math.MaxUint64} {
		add(msgp.AppendUint64(nil, v))
	}
	add(msgp.AppendFloat32(nil, 1.5))
	add(msgp.AppendFloat64(nil, 1.5))
	for _, n := range []int{0, 31, 32, 255, 256, 65536} {
		add(msgp.AppendString(nil, strings.Repeat("s", n)))
		add(msgp.AppendBytes(nil, make([]byte, n)))
	}
	// ext: fixext 1, 2, 4, 8, 16 and ext 8, 16, 32 (type byte 5).
	for _, n := range []int{1, 2, 4, 8, 16} {
		add(append([]byte{map[int]byte{1: 0xd4, 2: 0xd5, 4: 0xd6, 8: 0xd7, 16: 0xd8}[n], 5}, make([]byte, n)...))
	}
	add(append([]byte{0xc7, 3, 5}, 1, 2, 3))
	add(append([]byte{0xc8, 0x01, 0x00, 5}, make([]byte, 256)...))
	add(append([]byte{0xc9, 0, 1, 0, 0, 5}, make([]byte, 65536)...))
	// Containers of every header size, nested.
	nested := map[string]any{"a": []any{int64(1), "x", nil, map[string]any{"b": []byte{1}}}, "c": 2.5}
	b, err := msgp.AppendIntf(nil, nested)
	if err != nil {
		panic(err)
	}
	add(b)
	for _, n := range []int{0, 15, 16, 65536} {
		arr := msgp.AppendArrayHeader(nil, uint32(n))
		m := msgp.AppendMapHeader(nil, uint32(n))
		for i := 0; i < n; i++ {
			arr = msgp.AppendInt(arr, i)
			m = msgp.AppendInt(msgp.AppendInt(m, i), -i)
		}
		add(arr)
		add(m)
	}
	return out
}

func TestSkip(t *testing.T) {
	// skip agrees with msgp.Skip on every type and on every truncation of it, and fails where it fails.
	f := func(b []byte) {
		t.Helper()
		want, wantErr := msgp.Skip(b)
		got, err := skip(b)
		if (err == nil) != (wantErr == nil) || len(got) != len(want) && err == nil {
			t.Fatalf("%x: skip left %d bytes (err %v); msgp.Skip %d (err %v)",
				b[:min(len(b), 16)], len(got), err, len(want), wantErr)
		}
	}
	for _, v := range skipSamples() {
		f(v)
		f(append(v, 0xc0, 0x01)) // a trailer stays
		for n := 0; n < len(v) && n < 300; n++ {
			f(v[:n])
		}
	}
	f([]byte{0xc1})
	f([]byte{0x92, 0xc1, 0x01})
	// A header announcing more objects than bytes fails at once.
	_, err := skip([]byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0x01})
	if err == nil || !strings.Contains(err.Error(), "objects announced") {
		t.Fatalf("unexpected error %v", err)
	}
}

func FuzzSkip(f *testing.F) {
	for _, v := range skipSamples() {
		if len(v) < 1024 {
			f.Add(v)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want, wantErr := msgp.Skip(b)
		got, err := skip(b)
		if errors.Is(wantErr, msgp.ErrRecursion) {
			return // skip has no depth limit
		}
		if (err == nil) != (wantErr == nil) || err == nil && len(got) != len(want) {
			t.Fatalf("skip left %d bytes (err %v); msgp.Skip %d (err %v)", len(got), err, len(want), wantErr)
		}
	})
}

func TestDecodeDeepNesting(t *testing.T) {
	// An unknown field nested 500,000 levels deep (1 byte a level) is skipped with no stack to speak of:
	// msgp.Skip recursed, failing at 100,000 levels after growing the goroutine's stack to 8 MiB.
	deep := append(bytes.Repeat([]byte{0x91}, 500_000), 0xc0)
	payload := msgp.AppendArrayHeader(nil, 4)
	payload = msgp.AppendFloat64(payload, 1)
	payload = msgp.AppendArrayHeader(payload, 1)
	payload = append(payload, removedEvent(42)...)
	payload = msgp.AppendInt(payload, 0)
	payload = append(payload, deep...) // a trailing batch element: skipped
	var growth int64
	var err error
	var r recorder
	done := make(chan struct{})
	go func() {
		defer close(done)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		var d Decoder
		_, err = d.Decode(payload, &r)
		runtime.ReadMemStats(&after)
		// Signed: StackInuse is the whole process's, and other goroutines' stacks may shrink meanwhile.
		growth = int64(after.StackInuse) - int64(before.StackInuse)
	}()
	<-done
	if err != nil || len(r.lines) != 1 {
		t.Fatalf("unexpected result %q %v", r.lines, err)
	}
	// A recursive skip needs tens of MiB here (8 MiB at 100,000 levels); the margin absorbs what other
	// goroutines of the process do meanwhile.
	if growth > 4<<20 {
		t.Fatalf("decoding grew the stack by %d bytes", growth)
	}
}

func TestDecoderReleasesLargeScratch(t *testing.T) {
	// One batch larger than retainScratch does not pin its scratch for the target's lifetime; smaller
	// ones keep theirs (the zero-allocation steady state).
	f := func(tokens int, wantKept bool) {
		t.Helper()
		var d Decoder
		var h countingHandler
		if _, err := d.Decode(batchOf(storedEvent([]uint64{1}, 0, make([]uint32, tokens), 16)), &h); err != nil {
			t.Fatalf("unexpected error: %s", err)
		}
		if kept := cap(d.tokens) > 0; kept != wantKept {
			t.Fatalf("%d tokens: scratch kept=%v (cap %d); want %v", tokens, kept, cap(d.tokens), wantKept)
		}
	}
	f(1<<16, true)
	f(retainScratch/4+1, false)
}
