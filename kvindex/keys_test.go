package kvindex

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// refBlockKeys is the definition of own keys, written the slow way: one concatenated buffer per block.
func refBlockKeys(tokens []uint32, bs int) []uint64 {
	var keys []uint64
	parent := RootKey
	for bs > 0 && len(tokens) >= bs {
		buf := binary.LittleEndian.AppendUint64(nil, parent)
		for _, t := range tokens[:bs] {
			buf = binary.LittleEndian.AppendUint32(buf, t)
		}
		parent = xxhash.Sum64(buf)
		if parent == 0 {
			parent = 1
		}
		keys = append(keys, parent)
		tokens = tokens[bs:]
	}
	return keys
}

func TestBlockKeys(t *testing.T) {
	f := func(nTokens, bs int, wantKeys int) {
		t.Helper()
		tokens := make([]uint32, nTokens)
		for i := range tokens {
			tokens[i] = uint32(i*7919 + 3)
		}
		got := BlockKeys(nil, tokens, bs)
		if len(got) != wantKeys {
			t.Fatalf("tokens=%d bs=%d: got %d keys; want %d", nTokens, bs, len(got), wantKeys)
		}
		if want := refBlockKeys(tokens, bs); !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
			t.Fatalf("tokens=%d bs=%d: keys differ from the definition\ngot  %x\nwant %x", nTokens, bs, got, want)
		}
	}
	f(0, 16, 0)
	f(15, 16, 0)
	f(16, 16, 1)
	f(33, 16, 2) // the partial third block has no key
	f(5, 1, 5)
	// Block sizes around the 64-token chunk of the hasher.
	f(126, 63, 2)
	f(128, 64, 2)
	f(130, 65, 2)
	f(600, 200, 3)
	f(10, 0, 0)
	f(10, -1, 0)
}

func TestBlockKeysChain(t *testing.T) {
	// A key depends on every earlier block: the same block after different prefixes differs, and a shared
	// prefix gives shared keys.
	a := BlockKeys(nil, []uint32{1, 2, 3, 4, 5, 6}, 2)
	b := BlockKeys(nil, []uint32{1, 2, 9, 9, 5, 6}, 2)
	if a[0] != b[0] {
		t.Fatalf("shared first block must give the same key")
	}
	if a[1] == b[1] || a[2] == b[2] {
		t.Fatalf("keys after a divergent block must differ: %x vs %x", a, b)
	}
	// Appending to dst keeps what is there.
	dst := BlockKeys([]uint64{7}, []uint32{1, 2}, 2)
	if len(dst) != 2 || dst[0] != 7 || dst[1] != a[0] {
		t.Fatalf("unexpected dst %x", dst)
	}
}
