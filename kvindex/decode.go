package kvindex

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/tinylib/msgp/msgp"
)

// Batch describes one decoded KV-event batch (vLLM EventBatch).
type Batch struct {
	// TS is the publisher's time.time() in seconds.
	TS float64
	// DPRank is the data-parallel rank when HasRank is set (vllm-project/vllm#18925; nil or absent before).
	DPRank  int64
	HasRank bool
	// Events is the number of events delivered to the Handler.
	Events int
	// Skipped is the number of events of unknown type that were skipped.
	Skipped int
}

// BlockStored is a decoded BlockStored event.
//
// Slices alias the Decoder's scratch or the payload and are valid only during the Handler callback.
type BlockStored struct {
	// Hashes are the engine's block hashes, folded to uint64 (see doc.go).
	Hashes []uint64
	// Parent is the engine hash of the block before Hashes[0] when HasParent is set.
	// A nil parent (vLLM) or 0 (llm-d-inference-sim) leaves HasParent unset.
	Parent    uint64
	HasParent bool
	// Tokens holds the token ids of all stored blocks, concatenated.
	Tokens    []uint32
	BlockSize int
	LoRAID    int64
	HasLoRAID bool
	// Medium is nil for the GPU pool of older eras, else "GPU", "CPU", "STORAGE", ...
	Medium   []byte
	LoRAName []byte
	// GroupIdx is the KV cache group (hybrid models) when HasGroupIdx is set.
	GroupIdx    int64
	HasGroupIdx bool
	// SpecKind is kv_cache_spec_kind ("full_attention", "sliding_window") or nil.
	SpecKind []byte
	// SlidingWindow is kv_cache_spec_sliding_window when HasSlidingWindow is set.
	SlidingWindow    int64
	HasSlidingWindow bool
}

// BlockRemoved is a decoded BlockRemoved event.
//
// Slices are valid only during the Handler callback.
type BlockRemoved struct {
	Hashes      []uint64
	Medium      []byte
	GroupIdx    int64
	HasGroupIdx bool
}

// Handler receives the events of a batch in order.
//
// The pointers and the slices they hold are valid only during the call.
type Handler interface {
	BlockStored(ev *BlockStored)
	BlockRemoved(ev *BlockRemoved)
	AllBlocksCleared()
}

// errMalformed is wrapped by every error Decode returns.
var errMalformed = errors.New("malformed kv event batch")

// Decoder decodes vLLM KV-event batch payloads without allocating once its scratch has grown to the
// largest batch seen (up to retainScratch; a larger batch's scratch is let go after it).
//
// A Decoder is not safe for concurrent use; keep one per subscriber goroutine.
type Decoder struct {
	hashes []uint64
	tokens []uint32
	evs    []event
	stored BlockStored
	remove BlockRemoved
	budget int // scratch bytes the batch being decoded may still use
}

// Scratch bounds. Every element a batch holds takes at least one payload byte, but decodes into more
// scratch: 8 bytes per block hash, 4 per token id and eventBytes (160) per event, so scratch is bounded by
// its own budget, not by the payload. Without it a 16 MiB payload of empty BlockRemoved events (15 bytes
// each) decoded into 180 MB of event records and one of 1-byte hashes into 128 MB; with append's growth
// copies that was 934 MB and 769 MB of allocation, 56x and 46x the payload.
const (
	// maxBatchScratch is the scratch one batch may use; a batch that needs more is malformed. Real batches
	// are far below it: a 128k-token prefill at block size 16 needs 8,192 x 8 + 131,072 x 4 bytes = 576 KiB,
	// a whole 1M-token step 4.5 MiB, plus 10 MiB if it also evicted 65,536 blocks (one BlockRemoved each).
	maxBatchScratch = 32 << 20
	// retainScratch is the scratch a Decoder keeps between batches: enough for any 128k-token batch, while
	// a rare larger one does not pin its scratch for the target's lifetime.
	retainScratch = 4 << 20
	eventBytes    = int(unsafe.Sizeof(event{}))
)

const (
	kindStored = iota + 1
	kindRemoved
	kindCleared
)

// event is a decoded event whose hashes and tokens are index ranges into Decoder scratch, so that scratch
// may grow while later events are decoded.
type event struct {
	kind       uint8
	hasParent  bool
	hasLoRAID  bool
	hasGroup   bool
	hasWindow  bool
	h0, h1     int
	t0, t1     int
	parent     uint64
	blockSize  int64
	loraID     int64
	groupIdx   int64
	window     int64
	medium     []byte
	loraName   []byte
	specKind   []byte
	hashesSeen bool
}

// Decode decodes payload and calls h for each event, in order.
//
// The whole payload is validated before the first callback, so a malformed batch delivers no events at all
// (a batch is applied whole or not at all). Slices in the events alias d's scratch and payload and are valid
// only during the callback. Malformed input returns an error wrapping errMalformed; Decode never panics and
// never allocates in proportion to a header's claim (every array and map header is checked against the bytes
// left).
func (d *Decoder) Decode(payload []byte, h Handler) (Batch, error) {
	d.hashes = d.hashes[:0]
	d.tokens = d.tokens[:0]
	d.evs = d.evs[:0]
	d.budget = maxBatchScratch
	var bt Batch
	if err := d.decodeBatch(payload, &bt); err != nil {
		d.release()
		return Batch{}, fmt.Errorf("cannot decode kv event batch: %w: %w", errMalformed, err)
	}
	for i := range d.evs {
		e := &d.evs[i]
		switch e.kind {
		case kindStored:
			s := &d.stored
			s.Hashes = d.hashes[e.h0:e.h1:e.h1]
			s.Parent = e.parent
			s.HasParent = e.hasParent
			s.Tokens = d.tokens[e.t0:e.t1:e.t1]
			s.BlockSize = int(e.blockSize)
			s.LoRAID = e.loraID
			s.HasLoRAID = e.hasLoRAID
			s.Medium = e.medium
			s.LoRAName = e.loraName
			s.GroupIdx = e.groupIdx
			s.HasGroupIdx = e.hasGroup
			s.SpecKind = e.specKind
			s.SlidingWindow = e.window
			s.HasSlidingWindow = e.hasWindow
			h.BlockStored(s)
		case kindRemoved:
			r := &d.remove
			r.Hashes = d.hashes[e.h0:e.h1:e.h1]
			r.Medium = e.medium
			r.GroupIdx = e.groupIdx
			r.HasGroupIdx = e.hasGroup
			h.BlockRemoved(r)
		case kindCleared:
			h.AllBlocksCleared()
		}
	}
	bt.Events = len(d.evs)
	d.release()
	return bt, nil
}

// release drops references into the payload so that scratch does not pin old frames, and lets scratch
// beyond retainScratch go.
func (d *Decoder) release() {
	d.stored = BlockStored{}
	d.remove = BlockRemoved{}
	if cap(d.hashes)*8+cap(d.tokens)*4+cap(d.evs)*eventBytes > retainScratch {
		d.hashes, d.tokens, d.evs = nil, nil, nil
		return
	}
	for i := range d.evs {
		e := &d.evs[i]
		e.medium, e.loraName, e.specKind = nil, nil, nil
	}
}

// grow returns s with room for need more elements, growing it to twice its capacity but by at most
// need+spare elements, spare being what the batch's budget could still pay for. Go's append grows
// large slices by 1.25x, so a batch near maxBatchScratch allocated five times its scratch in copies;
// doubling makes it twice.
func grow[T any](s []T, need, spare int) []T {
	if cap(s)-len(s) >= need {
		return s
	}
	n := min(max(2*cap(s), len(s)+need, 64), len(s)+need+spare)
	t := make([]T, len(s), n)
	copy(t, s)
	return t
}

// spend takes n bytes from the batch's scratch budget and reports whether the budget covered them (else the
// batch is malformed: errScratch).
func (d *Decoder) spend(n int) bool {
	d.budget -= n
	return d.budget >= 0
}

var errScratch = fmt.Errorf("batch needs more than %d bytes of decoder scratch", maxBatchScratch)

func (d *Decoder) decodeBatch(b []byte, bt *Batch) error {
	var err error
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		var n int
		n, b, err = readArrayHeader(b)
		if err != nil {
			return err
		}
		if n < 2 {
			return fmt.Errorf("batch array has %d elements; want at least 2 (ts, events)", n)
		}
		if bt.TS, b, err = readFloat(b); err != nil {
			return fmt.Errorf("cannot read ts: %w", err)
		}
		if b, err = d.readEvents(b, bt); err != nil {
			return err
		}
		if n >= 3 {
			if bt.DPRank, bt.HasRank, b, err = readOptInt(b); err != nil {
				return fmt.Errorf("cannot read data_parallel_rank: %w", err)
			}
		}
		for i := 3; i < n; i++ {
			if b, err = skip(b); err != nil {
				return err
			}
		}
	case msgp.MapType:
		// One stored vLLM copy (@0181ea3) has a map-shaped EventBatch; accepting it costs little.
		var n int
		n, b, err = readMapHeader(b)
		if err != nil {
			return err
		}
		seenEvents := false
		for i := 0; i < n; i++ {
			var k []byte
			if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
				return fmt.Errorf("cannot read batch key: %w", err)
			}
			switch string(k) {
			case "ts":
				if bt.TS, b, err = readFloat(b); err != nil {
					return fmt.Errorf("cannot read ts: %w", err)
				}
			case "events":
				if seenEvents {
					return errors.New("duplicate events key")
				}
				seenEvents = true
				if b, err = d.readEvents(b, bt); err != nil {
					return err
				}
			case "data_parallel_rank":
				if bt.DPRank, bt.HasRank, b, err = readOptInt(b); err != nil {
					return fmt.Errorf("cannot read data_parallel_rank: %w", err)
				}
			default:
				if b, err = skip(b); err != nil {
					return err
				}
			}
		}
		if !seenEvents {
			return errors.New("batch map has no events")
		}
	default:
		return fmt.Errorf("batch is %s; want array or map", msgp.NextType(b))
	}
	if len(b) != 0 {
		return fmt.Errorf("%d trailing bytes after the batch", len(b))
	}
	return nil
}

func (d *Decoder) readEvents(b []byte, bt *Batch) ([]byte, error) {
	if msgp.IsNil(b) {
		return b[1:], nil
	}
	n, b, err := readArrayHeader(b)
	if err != nil {
		return b, fmt.Errorf("cannot read events: %w", err)
	}
	for i := 0; i < n; i++ {
		var skipped bool
		if b, skipped, err = d.readEvent(b); err != nil {
			return b, fmt.Errorf("cannot read event %d: %w", i, err)
		}
		if skipped {
			bt.Skipped++
		}
	}
	return b, nil
}

// readEvent decodes one event into d.evs; skipped reports an event of unknown type.
func (d *Decoder) readEvent(b []byte) (_ []byte, skipped bool, err error) {
	switch msgp.NextType(b) {
	case msgp.ArrayType:
		return d.readArrayEvent(b)
	case msgp.MapType:
		return d.readMapEvent(b)
	default:
		return b, false, fmt.Errorf("event is %s; want array or map", msgp.NextType(b))
	}
}

// readArrayEvent decodes a tagged positional event: [tag, fields...] (msgspec array_like; the eras are in
// doc.go). Missing trailing fields are nil; unknown trailing fields are skipped.
func (d *Decoder) readArrayEvent(b []byte) ([]byte, bool, error) {
	n, b, err := readArrayHeader(b)
	if err != nil {
		return b, false, err
	}
	if n < 1 {
		return b, false, errors.New("empty event array")
	}
	tag, b, err := msgp.ReadStringZC(b)
	if err != nil {
		return b, false, fmt.Errorf("cannot read event tag: %w", err)
	}
	n--
	e := event{h0: len(d.hashes), t0: len(d.tokens)}
	switch string(tag) {
	case "BlockStored":
		// Fields 1-4 (hashes, parent, tokens, block_size) are the minimum that means anything; every real
		// era also sends lora_id (6 elements with the tag).
		if n < 4 {
			return b, false, fmt.Errorf("BlockStored has %d fields; want at least 4", n)
		}
		e.kind = kindStored
		for i := 0; i < n; i++ {
			if b, err = d.readStoredField(b, &e, i); err != nil {
				return b, false, fmt.Errorf("cannot read BlockStored field %d: %w", i+1, err)
			}
		}
	case "BlockRemoved":
		if n < 1 {
			return b, false, errors.New("BlockRemoved has no block_hashes")
		}
		e.kind = kindRemoved
		for i := 0; i < n; i++ {
			if b, err = d.readRemovedField(b, &e, i); err != nil {
				return b, false, fmt.Errorf("cannot read BlockRemoved field %d: %w", i+1, err)
			}
		}
	case "AllBlocksCleared":
		e.kind = kindCleared
		for i := 0; i < n; i++ {
			if b, err = skip(b); err != nil {
				return b, false, err
			}
		}
	default:
		for i := 0; i < n; i++ {
			if b, err = skip(b); err != nil {
				return b, false, err
			}
		}
		return b, true, nil
	}
	e.h1, e.t1 = len(d.hashes), len(d.tokens)
	if !d.spend(eventBytes) {
		return b, false, errScratch
	}
	d.evs = grow(d.evs, 1, d.budget/eventBytes)
	d.evs = append(d.evs, e)
	return b, false, nil
}

// readStoredField reads positional BlockStored field i (0-based, after the tag); see section 2.3.
func (d *Decoder) readStoredField(b []byte, e *event, i int) ([]byte, error) {
	var err error
	switch i {
	case 0:
		b, err = d.readHashes(b)
	case 1:
		e.parent, e.hasParent, b, err = readParent(b)
	case 2:
		b, err = d.readTokens(b)
	case 3:
		e.blockSize, b, err = readBlockSize(b)
	case 4:
		e.loraID, e.hasLoRAID, b, err = readOptInt(b)
	case 5:
		e.medium, b, err = readOptStr(b)
	case 6:
		e.loraName, b, err = readOptStr(b)
	case 8:
		// Fields 8+ are newer optional ones; one unmerged vLLM copy inserts event_version before
		// extra_keys, shifting them, so a type mismatch here skips the field instead of failing.
		e.groupIdx, e.hasGroup, b, err = lenientInt(b)
	case 9:
		e.specKind, b, err = lenientStr(b)
	case 10:
		e.window, e.hasWindow, b, err = lenientInt(b)
	default:
		// 7 = extra_keys (not used by the index), 11+ = unknown newer fields.
		b, err = skip(b)
	}
	return b, err
}

func (d *Decoder) readRemovedField(b []byte, e *event, i int) ([]byte, error) {
	var err error
	switch i {
	case 0:
		b, err = d.readHashes(b)
	case 1:
		e.medium, b, err = readOptStr(b)
	case 2:
		e.groupIdx, e.hasGroup, b, err = lenientInt(b)
	default:
		b, err = skip(b)
	}
	return b, err
}

// readMapEvent decodes a tagged map event ({"type": ..., field: value}, vllm-project/vllm#42892) in one
// pass: "type" may come in any position, so every known field is read into e and the kind is settled at
// the end. Unknown keys are skipped.
func (d *Decoder) readMapEvent(b []byte) ([]byte, bool, error) {
	n, b, err := readMapHeader(b)
	if err != nil {
		return b, false, err
	}
	e := event{h0: len(d.hashes), t0: len(d.tokens)}
	var tag []byte
	hasTag, hasTokens, hasSize := false, false, false
	for i := 0; i < n; i++ {
		var k []byte
		if k, b, err = msgp.ReadMapKeyZC(b); err != nil {
			return b, false, fmt.Errorf("cannot read event key: %w", err)
		}
		switch string(k) {
		case "type":
			if tag, b, err = msgp.ReadStringZC(b); err != nil {
				return b, false, fmt.Errorf("cannot read event type: %w", err)
			}
			hasTag = true
		case "block_hashes":
			if e.hashesSeen {
				return b, false, errors.New("duplicate block_hashes")
			}
			e.hashesSeen = true
			b, err = d.readHashes(b)
		case "parent_block_hash":
			e.parent, e.hasParent, b, err = readParent(b)
		case "token_ids":
			if hasTokens {
				return b, false, errors.New("duplicate token_ids")
			}
			hasTokens = true
			b, err = d.readTokens(b)
		case "block_size":
			hasSize = true
			e.blockSize, b, err = readBlockSize(b)
		case "lora_id":
			e.loraID, e.hasLoRAID, b, err = readOptInt(b)
		case "medium":
			e.medium, b, err = readOptStr(b)
		case "lora_name":
			e.loraName, b, err = readOptStr(b)
		case "group_idx":
			e.groupIdx, e.hasGroup, b, err = lenientInt(b)
		case "kv_cache_spec_kind":
			e.specKind, b, err = lenientStr(b)
		case "kv_cache_spec_sliding_window":
			e.window, e.hasWindow, b, err = lenientInt(b)
		default:
			b, err = skip(b)
		}
		if err != nil {
			return b, false, fmt.Errorf("cannot read event field %q: %w", k, err)
		}
	}
	unknown := false
	switch {
	case !hasTag:
		unknown = true
	case string(tag) == "BlockStored":
		if !e.hashesSeen || !hasTokens || !hasSize {
			return b, false, errors.New("BlockStored lacks block_hashes, token_ids or block_size")
		}
		e.kind = kindStored
	case string(tag) == "BlockRemoved":
		if !e.hashesSeen {
			return b, false, errors.New("BlockRemoved lacks block_hashes")
		}
		e.kind = kindRemoved
	case string(tag) == "AllBlocksCleared":
		e.kind = kindCleared
	default:
		unknown = true
	}
	if unknown {
		d.hashes = d.hashes[:e.h0]
		d.tokens = d.tokens[:e.t0]
		return b, true, nil
	}
	e.h1, e.t1 = len(d.hashes), len(d.tokens)
	if !d.spend(eventBytes) {
		return b, false, errScratch
	}
	d.evs = grow(d.evs, 1, d.budget/eventBytes)
	d.evs = append(d.evs, e)
	return b, false, nil
}

func (d *Decoder) readHashes(b []byte) ([]byte, error) {
	n, b, err := readArrayHeader(b)
	if err != nil {
		return b, err
	}
	if !d.spend(8 * n) {
		return b, errScratch
	}
	for i := 0; i < n; i++ {
		var h uint64
		if h, b, err = readHash(b); err != nil {
			return b, err
		}
		// One at a time: what the header claims is paid for (spend above) but not allocated before the
		// elements are there.
		d.hashes = grow(d.hashes, 1, n-i-1+d.budget/8)
		d.hashes = append(d.hashes, h)
	}
	return b, nil
}

func (d *Decoder) readTokens(b []byte) ([]byte, error) {
	if msgp.IsNil(b) {
		return b[1:], nil
	}
	n, b, err := readArrayHeader(b)
	if err != nil {
		return b, err
	}
	if !d.spend(4 * n) {
		return b, errScratch
	}
	d.tokens = grow(d.tokens, n, d.budget/4)
	for i := 0; i < n; i++ {
		// Token ids are most of a batch's bytes: decode the widths emitters use (fixint, and uint8..32 as
		// msgspec and llm-d-inference-sim's 0xce write them) inline; anything else takes msgp's path.
		if len(b) == 0 {
			return b, msgp.ErrShortBytes
		}
		var t uint64
		switch c := b[0]; {
		case c < 0x80:
			t, b = uint64(c), b[1:]
		case c == 0xcd && len(b) >= 3:
			t, b = uint64(binary.BigEndian.Uint16(b[1:])), b[3:]
		case c == 0xce && len(b) >= 5:
			t, b = uint64(binary.BigEndian.Uint32(b[1:])), b[5:]
		default:
			if t, b, err = msgp.ReadUint64Bytes(b); err != nil {
				return b, err
			}
			if t > math.MaxUint32 {
				return b, fmt.Errorf("token id %d does not fit 32 bits", t)
			}
		}
		d.tokens = append(d.tokens, uint32(t))
	}
	return b, nil
}

// readHash reads an ExternalBlockHash: an unsigned int (vLLM default, low 64 bits of the digest), a
// negative int (Python hash() of the builtin era, reinterpreted as uint64) or bin (raw digest with
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0), folded like llm-d: the last 8 bytes big-endian, left-padded
// when shorter, which equals vLLM's int form of the same digest.
func readHash(b []byte) (uint64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.UintType:
		return msgp.ReadUint64Bytes(b)
	case msgp.IntType:
		v, o, err := msgp.ReadInt64Bytes(b)
		return uint64(v), o, err
	case msgp.BinType:
		v, o, err := msgp.ReadBytesZC(b)
		if err != nil {
			return 0, o, err
		}
		return foldHash(v), o, nil
	default:
		return 0, b, fmt.Errorf("block hash is %s; want int or bin", msgp.NextType(b))
	}
}

func foldHash(v []byte) uint64 {
	if len(v) >= 8 {
		return binary.BigEndian.Uint64(v[len(v)-8:])
	}
	var h uint64
	for _, c := range v {
		h = h<<8 | uint64(c)
	}
	return h
}

// readParent reads parent_block_hash; nil (vLLM) and 0 (llm-d-inference-sim) both mean "first block".
func readParent(b []byte) (uint64, bool, []byte, error) {
	if msgp.IsNil(b) {
		return 0, false, b[1:], nil
	}
	h, b, err := readHash(b)
	if err != nil {
		return 0, false, b, err
	}
	return h, h != 0, b, nil
}

func readBlockSize(b []byte) (int64, []byte, error) {
	if msgp.IsNil(b) {
		return 0, b[1:], nil
	}
	v, b, err := readInt(b)
	if err != nil {
		return 0, b, err
	}
	if v < 0 || v > math.MaxInt32 {
		return 0, b, fmt.Errorf("block_size %d out of range", v)
	}
	return v, b, nil
}

// readInt reads any msgpack integer that fits int64.
func readInt(b []byte) (int64, []byte, error) {
	if msgp.NextType(b) == msgp.UintType {
		u, o, err := msgp.ReadUint64Bytes(b)
		if err != nil {
			return 0, o, err
		}
		if u > math.MaxInt64 {
			return 0, o, fmt.Errorf("integer %d overflows int64", u)
		}
		return int64(u), o, nil
	}
	return msgp.ReadInt64Bytes(b)
}

func readOptInt(b []byte) (int64, bool, []byte, error) {
	if msgp.IsNil(b) {
		return 0, false, b[1:], nil
	}
	v, b, err := readInt(b)
	return v, err == nil, b, err
}

func readOptStr(b []byte) ([]byte, []byte, error) {
	if msgp.IsNil(b) {
		return nil, b[1:], nil
	}
	return msgp.ReadStringZC(b)
}

// lenientInt reads an optional int of a newer field; a value of another type is skipped as absent
// (only a truncated or invalid encoding is an error).
func lenientInt(b []byte) (int64, bool, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.IntType, msgp.UintType:
		if v, o, err := readInt(b); err == nil {
			return v, true, o, nil
		}
	case msgp.NilType:
		return 0, false, b[1:], nil
	}
	o, err := skip(b)
	return 0, false, o, err
}

// lenientStr is lenientInt for optional strings.
func lenientStr(b []byte) ([]byte, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.StrType:
		if v, o, err := msgp.ReadStringZC(b); err == nil {
			return v, o, nil
		}
	case msgp.NilType:
		return nil, b[1:], nil
	}
	o, err := skip(b)
	return nil, o, err
}

func readFloat(b []byte) (float64, []byte, error) {
	switch msgp.NextType(b) {
	case msgp.Float64Type, msgp.Float32Type:
		return msgp.ReadFloat64Bytes(b)
	case msgp.IntType, msgp.UintType:
		v, o, err := readInt(b)
		return float64(v), o, err
	default:
		return 0, b, fmt.Errorf("ts is %s; want a number", msgp.NextType(b))
	}
}

// skip skips one msgpack object, nested to any depth, without recursion: it counts the objects still owed
// instead of descending into them, so nesting costs no stack. msgp.Skip recurses, up to 100,000 levels:
// 8 MiB of goroutine stack for a 100 KB payload. Every object takes at least one byte, so a count of owed
// objects above the bytes left is corrupt and fails at once.
func skip(b []byte) ([]byte, error) {
	for owed := uint64(1); owed > 0; owed-- {
		if len(b) == 0 {
			return b, msgp.ErrShortBytes
		}
		c := b[0]
		var hdr, body, objs uint64
		switch {
		case c <= 0x7f || c >= 0xe0: // positive and negative fixint
			hdr = 1
		case c <= 0x8f: // fixmap
			hdr, objs = 1, 2*uint64(c&0x0f)
		case c <= 0x9f: // fixarray
			hdr, objs = 1, uint64(c&0x0f)
		case c <= 0xbf: // fixstr
			hdr, body = 1, uint64(c&0x1f)
		default:
			if hdr = uint64(headerSize[c-0xc0]); hdr == 0 {
				return b, msgp.InvalidPrefixError(c)
			}
			if uint64(len(b)) < hdr {
				return b, msgp.ErrShortBytes
			}
			switch c {
			case 0xc4, 0xd9: // bin8, str8
				body = uint64(b[1])
			case 0xc5, 0xda: // bin16, str16
				body = uint64(binary.BigEndian.Uint16(b[1:]))
			case 0xc6, 0xdb: // bin32, str32
				body = uint64(binary.BigEndian.Uint32(b[1:]))
			case 0xc7: // ext8: type byte after the length
				body = 1 + uint64(b[1])
			case 0xc8:
				body = 1 + uint64(binary.BigEndian.Uint16(b[1:]))
			case 0xc9:
				body = 1 + uint64(binary.BigEndian.Uint32(b[1:]))
			case 0xdc: // array16
				objs = uint64(binary.BigEndian.Uint16(b[1:]))
			case 0xdd: // array32
				objs = uint64(binary.BigEndian.Uint32(b[1:]))
			case 0xde: // map16
				objs = 2 * uint64(binary.BigEndian.Uint16(b[1:]))
			case 0xdf: // map32
				objs = 2 * uint64(binary.BigEndian.Uint32(b[1:]))
			}
		}
		if uint64(len(b)) < hdr+body {
			return b, msgp.ErrShortBytes
		}
		b = b[hdr+body:]
		owed += objs
		if owed-1 > uint64(len(b)) {
			return b, fmt.Errorf("%d objects announced with %d bytes left", owed-1, len(b))
		}
	}
	return b, nil
}

// headerSize holds, for every msgpack prefix from 0xc0 to 0xdf, what skip does not compute: the whole
// object for nil, bool, numbers and fixext (type byte included), the header for str, bin, ext (whose type
// byte skip counts in the body), array and map. 0 marks 0xc1, which is never used.
var headerSize = [32]uint8{
	//lint:ignore SA4000 every index is written as prefix - 0xc0, so the table reads as the msgpack prefixes it maps.
	0xc0 - 0xc0: 1, 0xc2 - 0xc0: 1, 0xc3 - 0xc0: 1,
	0xc4 - 0xc0: 2, 0xc5 - 0xc0: 3, 0xc6 - 0xc0: 5, // bin
	0xc7 - 0xc0: 2, 0xc8 - 0xc0: 3, 0xc9 - 0xc0: 5, // ext
	0xca - 0xc0: 5, 0xcb - 0xc0: 9, // float
	0xcc - 0xc0: 2, 0xcd - 0xc0: 3, 0xce - 0xc0: 5, 0xcf - 0xc0: 9, // uint
	0xd0 - 0xc0: 2, 0xd1 - 0xc0: 3, 0xd2 - 0xc0: 5, 0xd3 - 0xc0: 9, // int
	0xd4 - 0xc0: 3, 0xd5 - 0xc0: 4, 0xd6 - 0xc0: 6, 0xd7 - 0xc0: 10, 0xd8 - 0xc0: 18, // fixext
	0xd9 - 0xc0: 2, 0xda - 0xc0: 3, 0xdb - 0xc0: 5, // str
	0xdc - 0xc0: 3, 0xdd - 0xc0: 5, // array
	0xde - 0xc0: 3, 0xdf - 0xc0: 5, // map
}

// readArrayHeader reads an array header and checks its count against the bytes left: every element takes
// at least one byte, so a corrupt header claiming 2^32 items fails here instead of driving a loop or an
// allocation.
func readArrayHeader(b []byte) (int, []byte, error) {
	n, o, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return 0, o, err
	}
	if uint64(n) > uint64(len(o)) {
		return 0, o, fmt.Errorf("array header claims %d elements with %d bytes left", n, len(o))
	}
	return int(n), o, nil
}

func readMapHeader(b []byte) (int, []byte, error) {
	n, o, err := msgp.ReadMapHeaderBytes(b)
	if err != nil {
		return 0, o, err
	}
	if 2*uint64(n) > uint64(len(o)) {
		return 0, o, fmt.Errorf("map header claims %d entries with %d bytes left", n, len(o))
	}
	return int(n), o, nil
}

// isGPU reports whether medium names the GPU pool: nil (eras before vllm-project/vllm#19737) or "GPU" in
// any case (llm-d's tests send "gpu").
func isGPU(medium []byte) bool {
	return medium == nil || bytes.EqualFold(medium, gpuMedium)
}

var gpuMedium = []byte("GPU")
