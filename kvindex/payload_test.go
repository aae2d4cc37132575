package kvindex

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/tinylib/msgp/msgp"
)

// Test vectors of docs/internals/test-vectors.md (verbatim hex; derived, not captured), and one
// event captured from llm-d-inference-sim.
const (
	hexTV2 = `92cb41d954fc402000009396ab426c6f636b53746f726564912ac092010202c092ac426c6f636b52656d6f766564912a
91b0416c6c426c6f636b73436c6561726564`
	hexTV3 = `93cb41d954fc402000009398ab426c6f636b53746f726564912ac092010202c0a3475055c093ac426c6f636b52656d6f
766564912aa347505591b0416c6c426c6f636b73436c656172656400`
	hexTV4 = `93cb41d954fc40200000939cab426c6f636b53746f726564912ac092010202c0a3475055c091c000ae66756c6c5f6174
74656e74696f6ec094ac426c6f636b52656d6f766564912aa34750550091b0416c6c426c6f636b73436c656172656400`
	hexTV5 = `93cb41d954fc40200000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573912ab1706172
656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964
c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b2
6b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d
6f766564ac626c6f636b5f686173686573912aa66d656469756da3475055a967726f75705f6964780081a474797065b0
416c6c426c6f636b73436c656172656400`
	hexMinimalMap = `93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573912ab1706172
656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920102aa626c6f636b5f73697a6502a76c6f72615f6964
c0a66d656469756da3475055a96c6f72615f6e616d65c000`
	// TV6 bytes-mode BlockRemoved map (one event; wrapped into a batch by the tests).
	hexTV6BinRemoved = `83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391c420000102030405060708090a0b0c0d
0e0f101112131415161718191a1b1c1d1e1fa66d656469756da3475055`
	hexTV7 = `93cb41d954fc402000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf26470bbe
c927f5bfb1706172656e745f626c6f636b5f68617368cf2ceabcfae6d332eaa9746f6b656e5f696473dc001011121314
15161718191a1b1c1d1e1f20aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72
615f6e616d65c000`
	// Captured llm-d-inference-sim BlockRemoved map event (docs/internals/test-vectors.md).
	hexSimRemoved = `83a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf3b84bf9cc9ca0f87
a66d656469756da3475055`
	// batch head [ts=1700000000.5, [<one event>], ...] and rank 0 tail, to wrap single events.
	hexBatchHead1 = `93cb41d954fc4020000091`
	hexRank0      = `00`
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.Join(strings.Fields(s), "")
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("cannot decode hex %q: %s", s, err)
	}
	return b
}

// wrap returns a positional batch [1700000000.5, [ev], 0] around one encoded event.
func wrap(t testing.TB, evHex string) []byte {
	t.Helper()
	return mustHex(t, hexBatchHead1+evHex+hexRank0)
}

// recorder is a Handler that renders every event as one line.
type recorder struct {
	lines []string
}

func optBytes(b []byte) string {
	if b == nil {
		return "-"
	}
	return string(b)
}

func (r *recorder) BlockStored(ev *BlockStored) {
	parent := "-"
	if ev.HasParent {
		parent = fmt.Sprint(ev.Parent)
	}
	lora := "-"
	if ev.HasLoRAID {
		lora = fmt.Sprint(ev.LoRAID)
	}
	group := "-"
	if ev.HasGroupIdx {
		group = fmt.Sprint(ev.GroupIdx)
	}
	window := "-"
	if ev.HasSlidingWindow {
		window = fmt.Sprint(ev.SlidingWindow)
	}
	r.lines = append(r.lines, fmt.Sprintf("stored h=%v p=%s t=%v bs=%d lora=%s/%s m=%s g=%s kind=%s w=%s",
		ev.Hashes, parent, ev.Tokens, ev.BlockSize, lora, optBytes(ev.LoRAName), optBytes(ev.Medium), group,
		optBytes(ev.SpecKind), window))
}

func (r *recorder) BlockRemoved(ev *BlockRemoved) {
	group := "-"
	if ev.HasGroupIdx {
		group = fmt.Sprint(ev.GroupIdx)
	}
	r.lines = append(r.lines, fmt.Sprintf("removed h=%v m=%s g=%s", ev.Hashes, optBytes(ev.Medium), group))
}

func (r *recorder) AllBlocksCleared() {
	r.lines = append(r.lines, "cleared")
}

// Builders of positional (array-era) payloads with msgp's Append functions.

func appendHashes(b []byte, hashes []uint64) []byte {
	b = msgp.AppendArrayHeader(b, uint32(len(hashes)))
	for _, h := range hashes {
		b = msgp.AppendUint64(b, h)
	}
	return b
}

func appendTokens(b []byte, tokens []uint32) []byte {
	b = msgp.AppendArrayHeader(b, uint32(len(tokens)))
	for _, t := range tokens {
		b = msgp.AppendUint32(b, t)
	}
	return b
}

// storedEvent encodes ["BlockStored", hashes, parent (nil when 0), tokens, bs, nil, "GPU", nil] (8 elements,
// the lora_name era).
func storedEvent(hashes []uint64, parent uint64, tokens []uint32, bs int) []byte {
	b := msgp.AppendArrayHeader(nil, 8)
	b = msgp.AppendString(b, "BlockStored")
	b = appendHashes(b, hashes)
	if parent == 0 {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendUint64(b, parent)
	}
	b = appendTokens(b, tokens)
	b = msgp.AppendInt(b, bs)
	b = msgp.AppendNil(b)
	b = msgp.AppendString(b, "GPU")
	b = msgp.AppendNil(b)
	return b
}

func removedEvent(hashes ...uint64) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendString(b, "BlockRemoved")
	b = appendHashes(b, hashes)
	return msgp.AppendString(b, "GPU")
}

func clearedEvent() []byte {
	b := msgp.AppendArrayHeader(nil, 1)
	return msgp.AppendString(b, "AllBlocksCleared")
}

// batchOf encodes [ts, events, 0].
func batchOf(events ...[]byte) []byte {
	b := msgp.AppendArrayHeader(nil, 3)
	b = msgp.AppendFloat64(b, 1700000000.5)
	b = msgp.AppendArrayHeader(b, uint32(len(events)))
	for _, ev := range events {
		b = append(b, ev...)
	}
	return msgp.AppendInt(b, 0)
}

// seqRange returns the token ids from..to inclusive.
func seqRange(from, to uint32) []uint32 {
	var ts []uint32
	for t := from; t <= to; t++ {
		ts = append(ts, t)
	}
	return ts
}

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}
