package sim

import (
	"encoding/hex"
	"testing"
)

// Test vector TV7 (docs/internals/test-vectors.md): sha256_cbor with PYTHONHASHSEED=0,
// block size 16, tokens 1..32.
func TestBlockHashTV7(t *testing.T) {
	if got := hex.EncodeToString(noneHash[:]); got != "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e" {
		t.Fatalf("NONE_HASH = %s", got)
	}
	tokens := make([]uint32, 40) // 2 full blocks and a partial one, which gets no hash
	for i := range tokens {
		tokens[i] = uint32(i + 1)
	}
	cbor := appendBlockCBOR(nil, &noneHash, tokens[:16], "")
	wantCBOR := "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e900102030405060708090a0b0c0d0e0f10f6"
	if got := hex.EncodeToString(cbor); got != wantCBOR {
		t.Fatalf("block 1 CBOR:\ngot  %s\nwant %s", got, wantCBOR)
	}
	hashes, _ := appendBlockHashes(nil, nil, tokens, 16, "")
	if len(hashes) != 2 {
		t.Fatalf("got %d hashes, want 2", len(hashes))
	}
	f := func(h blockHash, wantHex string, wantInt uint64) {
		t.Helper()
		if got := hex.EncodeToString(h[:]); got != wantHex {
			t.Fatalf("hash %s, want %s", got, wantHex)
		}
		if got := h.wireInt(); got != wantInt {
			t.Fatalf("wire int %d, want %d", got, wantInt)
		}
	}
	f(hashes[0], "202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea", 3236607068019569386)
	f(hashes[1], "4a0a393805c6d2f0ed831000d41bb65980336c4c04895d5e26470bbec927f5bf", 2758186210834249151)
}

func TestCBORHead(t *testing.T) {
	f := func(major byte, v uint64, want string) {
		t.Helper()
		if got := hex.EncodeToString(appendCBORHead(nil, major, v)); got != want {
			t.Fatalf("head(%d, %d) = %s, want %s", major, v, got, want)
		}
	}
	f(0, 0, "00")
	f(0, 23, "17")
	f(0, 24, "1818")
	f(0, 255, "18ff")
	f(0, 256, "190100")
	f(0, 65536, "1a00010000")
	f(0, 1<<32, "1b0000000100000000")
	f(4, 16, "90")
	f(4, 300, "99012c")
}
