package cluster

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// evidenceMsg encodes a message from replica from with one record per engine.
func evidenceMsg(from uint64, recs map[uint64][]uint64) []byte {
	b := appendHeader(nil, from)
	for e, cps := range recs {
		b = appendRecord(b, e, cps)
	}
	return b
}

func TestParseEvidence(t *testing.T) {
	valid := evidenceMsg(42, map[uint64][]uint64{7: chain(1, 3)})
	f := func(name string, msg []byte, want error) {
		t.Helper()
		from, recs, err := parseEvidence(msg)
		if err != want {
			t.Fatalf("%s: err %v; want %v", name, err, want)
		}
		if err == nil && (from != 42 || len(recs) != len(msg)-headerBytes) {
			t.Fatalf("%s: from %d, %d record bytes", name, from, len(recs))
		}
	}
	f("valid", valid, nil)
	f("empty", nil, errSize)
	f("header only", valid[:headerBytes], errSize)
	f("truncated record", valid[:len(valid)-1], errTruncated)
	f("truncated header", valid[:headerBytes+5], errSize)
	f("trailing byte", append(append([]byte(nil), valid...), 0), errTruncated)
	f("wrong version", append([]byte{2}, valid[1:]...), errVersion)
	f("oversized", make([]byte, maxEvidenceBytes+1), errSize)
	f("garbage", []byte(strings.Repeat("garbage!", 10)), errVersion)
	f("garbage after a version byte", []byte(strings.Repeat("\x01garbage!", 10)), errTruncated)

	zero := bytes.Clone(valid)
	zero[headerBytes+8] = 0
	f("count 0", zero, errCount)
	over := bytes.Clone(valid)
	over[headerBytes+8] = maxCheckpoints + 1
	f("count 97", over, errCount)
	// A count that claims more than the message holds: refused without reading (or allocating) that much.
	claim := bytes.Clone(valid)
	claim[headerBytes+8] = maxCheckpoints
	f("count past the end", claim, errTruncated)

	full := appendHeader(nil, 42)
	for len(full)+maxRecordBytes <= maxEvidenceBytes {
		full = appendRecord(full, 1, chain(2, maxCheckpoints))
	}
	f("largest", full, nil)
}

func TestRecordReader(t *testing.T) {
	b := appendHeader(nil, 1)
	b = appendRecord(b, 10, chain(1, 1))
	b = appendRecord(b, 11, chain(2, maxCheckpoints))
	b = appendRecord(b, 12, chain(3, 5))
	_, recs, err := parseEvidence(b)
	if err != nil {
		t.Fatal(err)
	}
	r := recordReader{recs}
	for i, want := range []struct {
		engine uint64
		cps    []uint64
	}{{10, chain(1, 1)}, {11, chain(2, maxCheckpoints)}, {12, chain(3, 5)}} {
		engine, cps, ok := r.next()
		if !ok || engine != want.engine || len(cps) != 8*len(want.cps) {
			t.Fatalf("record %d: engine %d, %d bytes, ok %v", i, engine, len(cps), ok)
		}
		for j, cp := range want.cps {
			if got := binary.LittleEndian.Uint64(cps[8*j:]); got != cp {
				t.Fatalf("record %d cp %d: %x; want %x", i, j, got, cp)
			}
		}
	}
	if _, _, ok := r.next(); ok {
		t.Fatal("a fourth record")
	}
}

func TestApplyEvidenceMalformed(t *testing.T) {
	// A malformed message inserts nothing, not even the records before the fault.
	c := newTestCluster(testConfig())
	good := appendRecord(appendHeader(nil, 2), 5, chain(1, 4))
	bad := append(bytes.Clone(good), 0, 0, 0) // a cut-short second record
	if err := c.applyEvidence(bad); err == nil {
		t.Fatal("applied a truncated message")
	}
	if n := c.table.used.Load(); n != 0 {
		t.Fatalf("a malformed message inserted %d entries", n)
	}
	if err := c.applyEvidence(good); err != nil {
		t.Fatal(err)
	}
	if got := c.Held(5, chain(1, 10)); got != 4 {
		t.Fatalf("Held = %d; want 4", got)
	}
	// Its own messages are ignored (NoEcho makes them rare: a second connection of the same process).
	own := appendRecord(appendHeader(nil, 1), 6, chain(1, 4))
	if err := c.applyEvidence(own); err != nil || c.Held(6, chain(1, 4)) != 0 {
		t.Fatalf("applied its own evidence (err %v)", err)
	}
}

func TestDecodeLoad(t *testing.T) {
	f := func(msg string, wantErr string) {
		t.Helper()
		_, err := decodeLoad([]byte(msg))
		if wantErr == "" && err != nil || wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)) {
			t.Fatalf("decodeLoad(%.60q): %v; want %q", msg, err, wantErr)
		}
	}
	f(`{"id":"a","inflight":{"p0":3,"p1":0}}`, "")
	f(`{"id":"a","inflight":{},"future":true}`, "")
	f(`{"id":"a"}`, "")
	f(`{"id":"","inflight":{}}`, "bad id")
	f(`{"id":"`+strings.Repeat("x", 65)+`"}`, "bad id")
	f(`{"id":"a","inflight":{"p0":-1}}`, "out of range")
	f(`{"id":"a","inflight":{"p0":16777217}}`, "out of range")
	f(`{"id":"a","inflight":{"":1}}`, "bad provider name")
	f(`{"id":"a","inflight":{"p0":1.5}}`, "cannot decode load")
	f(`{"id":"a","inflight":[1]}`, "cannot decode load")
	f(`{"id":"a"`, "cannot decode load")
	f(`garbage`, "cannot decode load")
	f(``, "cannot decode load")
	f(`{"id":"a","pad":"`+strings.Repeat("x", maxLoadBytes)+`"}`, "over")
	var many strings.Builder
	many.WriteString(`{"id":"a","inflight":{`)
	for i := 0; i <= maxProviders; i++ {
		if i > 0 {
			many.WriteByte(',')
		}
		many.WriteString(`"p` + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + `":1`)
	}
	many.WriteString(`}}`)
	f(many.String(), "providers")
}

func FuzzDecode(f *testing.F) {
	f.Add(evidenceMsg(1, map[uint64][]uint64{7: chain(1, 3)}))
	f.Add(appendRecord(appendRecord(appendHeader(nil, 9), 1, chain(2, maxCheckpoints)), 2, chain(3, 1)))
	f.Add([]byte{evidenceVersion})
	f.Add([]byte{evidenceVersion, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 255})
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte(`{"id":"a","inflight":{"p0":3}}`))
	c := newTestCluster(testConfig())
	f.Fuzz(func(t *testing.T, msg []byte) {
		// Load messages come from the same kind of peer: they must not panic either.
		_, _ = decodeLoad(msg)
		from, recs, err := parseEvidence(msg)
		if err != nil {
			return
		}
		// Accepted: re-encoding its records gives the message back, and applying it works.
		out := appendHeader(nil, from)
		r := recordReader{recs}
		for {
			engine, cps, ok := r.next()
			if !ok {
				break
			}
			if len(cps) == 0 || len(cps) > 8*maxCheckpoints || len(cps)%8 != 0 {
				t.Fatalf("record of %d checkpoint bytes accepted", len(cps))
			}
			out = binary.LittleEndian.AppendUint64(out, engine)
			out = append(out, byte(len(cps)/8))
			out = append(out, cps...)
		}
		if !bytes.Equal(out, msg) {
			t.Fatalf("re-encoded %x; want %x", out, msg)
		}
		if err := c.applyEvidence(msg); err != nil {
			t.Fatal(err)
		}
	})
}
