package tracing

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// The example of W3C Trace Context level 1, section 3.2.2.
const (
	specTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	specSpanID  = "00f067aa0ba902b7"
)

func mustTC(traceID, spanID string, flags byte) TraceContext {
	var tc TraceContext
	if _, err := hex.Decode(tc.TraceID[:], []byte(traceID)); err != nil {
		panic(err)
	}
	if _, err := hex.Decode(tc.SpanID[:], []byte(spanID)); err != nil {
		panic(err)
	}
	tc.Flags = flags
	return tc
}

func TestParseTraceparent(t *testing.T) {
	ok := func(in string, want TraceContext) {
		t.Helper()
		got, valid := ParseTraceparent([]byte(in))
		if !valid || got != want {
			t.Fatalf("ParseTraceparent(%q) = %+v, %v; want %+v, true", in, got, valid, want)
		}
	}
	bad := func(in string) {
		t.Helper()
		if got, valid := ParseTraceparent([]byte(in)); valid || got != (TraceContext{}) {
			t.Fatalf("ParseTraceparent(%q) = %+v, %v; want invalid", in, got, valid)
		}
	}
	spec := mustTC(specTraceID, specSpanID, 0)
	sampled := mustTC(specTraceID, specSpanID, 1)

	// Section 3.2.2.5's examples: sampled and not sampled.
	ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", sampled)
	ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", spec)
	// Unknown flags are kept for version 00 (level 2's random flag is 0x02).
	ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", mustTC(specTraceID, specSpanID, 3))
	ok("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", mustTC(specTraceID, specSpanID, 0xff))
	// HTTP optional whitespace around the value.
	ok(" \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\t ", sampled)

	// All-zero ids (sections 3.2.2.3 and 3.2.2.4).
	bad("00-00000000000000000000000000000000-00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01")
	// Uppercase hex is not HEXDIGLC.
	bad("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A")
	bad("0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	// Version ff is invalid (section 3.2.2.2).
	bad("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	// Version 00 has exactly four fields.
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")
	bad("00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e47366-0f067aa0ba902b7-01")
	bad("00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e473 -00f067aa0ba902b7-01")
	bad("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\x00")
	bad("")
	bad("00")
	bad(strings.Repeat("-", 55))

	// Future versions (section 3.2.4): parsed for their first four fields when followed by the end or a
	// dash; only the sampled flag is kept.
	ok("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", sampled)
	ok("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-the-future-will-be-like", sampled)
	ok("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe-", spec)
	bad("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01what")
	bad("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0")
	bad("cc-00000000000000000000000000000000-00f067aa0ba902b7-01-x")
	bad("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0X-x")
}

func TestAppendTraceparent(t *testing.T) {
	f := func(tc TraceContext, want string) {
		t.Helper()
		got := AppendTraceparent([]byte("x"), tc)
		if string(got) != "x"+want {
			t.Fatalf("AppendTraceparent = %q; want %q", got, "x"+want)
		}
	}
	f(mustTC(specTraceID, specSpanID, 1), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f(mustTC(specTraceID, specSpanID, 0), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	f(mustTC("ffffffffffffffffffffffffffffffff", "ffffffffffffffff", 0xff), "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-ff")

	// Round trip.
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 1000; i++ {
		tc := NewTraceContext(TraceContext{}, false, NewSampler(0.5))
		tc.Flags = byte(rng.Uint32())
		s := AppendTraceparent(nil, tc)
		if len(s) != TraceparentLen {
			t.Fatalf("AppendTraceparent(%+v) has %d bytes; want %d", tc, len(s), TraceparentLen)
		}
		got, ok := ParseTraceparent(s)
		if !ok || got != tc {
			t.Fatalf("round trip of %+v: %q parsed as %+v, %v", tc, s, got, ok)
		}
	}
}

func TestValidTracestate(t *testing.T) {
	f := func(in string, want bool) {
		t.Helper()
		if got := ValidTracestate([]byte(in)); got != want {
			t.Fatalf("ValidTracestate(%q) = %v; want %v", in, got, want)
		}
	}
	// Section 3.3.1.1's examples.
	f("congo=t61rcWkgMzE", true)
	f("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", true)
	f("rojo=00f067aa0ba902b7 ,\tcongo=t61rcWkgMzE", true)
	f(strings.Repeat("a", 512), true)
	f(strings.Repeat("a", 513), false)
	f("", false)
	f("congo=t61\nrcWkgMzE", false)
	f("congo=t61\rrcWkgMzE", false)
	f("congo=\x00", false)
	f("congo=\x7f", false)
	f("congo=caf\xc3\xa9", false)
}

func TestNewTraceContext(t *testing.T) {
	parent := mustTC(specTraceID, specSpanID, 1)
	seen := map[[8]byte]bool{}
	for i := 0; i < 1000; i++ {
		tc := NewTraceContext(parent, true, Sampler{})
		if tc.TraceID != parent.TraceID || !tc.Sampled() || tc.SpanID == parent.SpanID || !tc.IsValid() {
			t.Fatalf("child of a sampled parent: %+v", tc)
		}
		if seen[tc.SpanID] {
			t.Fatalf("span id %x repeated", tc.SpanID)
		}
		seen[tc.SpanID] = true
	}
	// Parent-based: an unsampled parent stays unsampled even with a sampler that keeps everything; flags
	// other than sampled are not passed on.
	parent.Flags = 0x02
	if tc := NewTraceContext(parent, true, NewSampler(1)); tc.Flags != 0 || tc.TraceID != parent.TraceID {
		t.Fatalf("child of an unsampled parent: %+v", tc)
	}
	parent.Flags = 0x03
	if tc := NewTraceContext(parent, true, Sampler{}); tc.Flags != FlagSampled {
		t.Fatalf("child of a sampled parent with other flags: flags %#x; want %#x", tc.Flags, FlagSampled)
	}
	// Without a parent: a new trace id each time, and the sampler decides on it.
	traces := map[[16]byte]bool{}
	for i := 0; i < 1000; i++ {
		tc := NewTraceContext(parent, false, NewSampler(0.5))
		if tc.TraceID == parent.TraceID || traces[tc.TraceID] || !tc.IsValid() {
			t.Fatalf("root %d: trace id %x reused", i, tc.TraceID)
		}
		traces[tc.TraceID] = true
		if tc.Sampled() != NewSampler(0.5).Sample(tc.TraceID) {
			t.Fatalf("root %d: sampled = %v, not the sampler's decision", i, tc.Sampled())
		}
	}
	if tc := NewTraceContext(TraceContext{}, false, NewSampler(0)); tc.Sampled() {
		t.Fatalf("ratio 0 sampled a new trace")
	}
	if tc := NewTraceContext(TraceContext{}, false, NewSampler(1)); !tc.Sampled() {
		t.Fatalf("ratio 1 did not sample a new trace")
	}
}

// TestSamplerMatchesOpenTelemetry: the same trace id gets the same decision from Sampler and from the
// SDK's TraceIDRatioBased, so a trace is sampled the same way at the gateway and in services behind it.
func TestSamplerMatchesOpenTelemetry(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, ratio := range []float64{0, 1e-9, 0.001, 0.1, 0.25, 0.5, 0.9, 0.999999, 1, 2, -1} {
		ours := NewSampler(ratio)
		theirs := sdktrace.TraceIDRatioBased(ratio)
		for i := 0; i < 20_000; i++ {
			var id [16]byte
			for j := range id {
				id[j] = byte(rng.Uint32())
			}
			if i == 0 {
				id = [16]byte{15: 1} // the smallest low half
			} else if i == 1 {
				id = [16]byte{8: 0xff, 9: 0xff, 10: 0xff, 11: 0xff, 12: 0xff, 13: 0xff, 14: 0xff, 15: 0xff}
			}
			res := theirs.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: trace.TraceID(id)})
			if want := res.Decision == sdktrace.RecordAndSample; ours.Sample(id) != want {
				t.Fatalf("ratio %v, trace id %x: Sample = %v; OpenTelemetry says %v", ratio, id, !want, want)
			}
		}
	}
}

func TestSamplerRatio(t *testing.T) {
	f := func(ratio float64, lo, hi int) {
		t.Helper()
		s := NewSampler(ratio)
		n := 0
		for i := 0; i < 100_000; i++ {
			if NewTraceContext(TraceContext{}, false, s).Sampled() {
				n++
			}
		}
		if n < lo || n > hi {
			t.Fatalf("ratio %v: %d of 100000 sampled; want %d..%d", ratio, n, lo, hi)
		}
	}
	// Binomial(100000, p): more than 6 standard deviations each side.
	f(0, 0, 0)
	f(0.01, 800, 1200)
	f(0.1, 9400, 10600)
	f(0.5, 49000, 51000)
	f(1, 100_000, 100_000)
}

// traceparentRE is the grammar of sections 3.2 and 3.2.4, as a reference for the fuzz test.
var traceparentRE = regexp.MustCompile(`(?s)^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$`)

func FuzzParseTraceparent(f *testing.F) {
	for _, s := range []string{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-what-the-future-will-be-like",
		" 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
		"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		in := append([]byte(nil), b...)
		tc, ok := ParseTraceparent(b)
		if string(b) != string(in) {
			t.Fatalf("ParseTraceparent changed its input")
		}
		trimmed := strings.Trim(string(b), " \t")
		m := traceparentRE.FindStringSubmatch(trimmed)
		want := m != nil && m[1] != "ff" && m[2] != strings.Repeat("0", 32) && m[3] != strings.Repeat("0", 16) &&
			!(m[1] == "00" && m[5] != "")
		if ok != want {
			t.Fatalf("ParseTraceparent(%q) = %v; the grammar says %v", b, ok, want)
		}
		if !ok {
			if tc != (TraceContext{}) {
				t.Fatalf("invalid %q returned %+v", b, tc)
			}
			return
		}
		if !tc.IsValid() || hex.EncodeToString(tc.TraceID[:]) != m[2] || hex.EncodeToString(tc.SpanID[:]) != m[3] {
			t.Fatalf("ParseTraceparent(%q) = %+v", b, tc)
		}
		if m[1] == "00" && string(AppendTraceparent(nil, tc)) != trimmed {
			t.Fatalf("version 00 %q does not round-trip: %q", trimmed, AppendTraceparent(nil, tc))
		}
	})
}
