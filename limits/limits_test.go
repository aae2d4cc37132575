package limits

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

const t0 = int64(1_700_000_000) * 1e9

// TestBucketBurstNeverOverTakes: 64 goroutines taking at once, at one instant, take at most the bucket's
// n, whatever the sizes of their takes; a take larger than n is refused with wait -1.
func TestBucketBurstNeverOverTakes(t *testing.T) {
	for _, n := range []int64{10, 1000, 1 << 40} {
		b := NewBucket(n)
		var taken atomic.Int64
		var wg sync.WaitGroup
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for range 200 {
					c := 1 + r.Int64N(max(n/20, 1))
					if ok, _ := b.Take(t0, c); ok {
						taken.Add(c)
					}
				}
			}()
		}
		wg.Wait()
		if got := taken.Load(); got > n || got < n-n/20-1 {
			t.Errorf("n %d: a burst took %d", n, got)
		}
		if ok, wait := b.Take(t0, n+1); ok || wait != -1 {
			t.Errorf("n %d: a take of n+1: ok %v wait %d", n, ok, wait)
		}
	}
}

// TestBucketRefills: an empty bucket holds half its units half a Window later, all of them a Window
// later, never more; the wait a refusal gives is when the take passes.
func TestBucketRefills(t *testing.T) {
	b := NewBucket(10)
	for i := range 10 {
		if ok, _ := b.Take(t0, 1); !ok {
			t.Fatalf("take %d of 10 refused", i+1)
		}
	}
	ok, wait := b.Take(t0, 1)
	if ok || wait != Window/10 {
		t.Fatalf("11th take: ok %v wait %d, want refused for %d", ok, wait, Window/10)
	}
	if r := b.Reset(t0); r != Window {
		t.Fatalf("reset %d, want a Window", r)
	}
	if ok, _ := b.Take(t0+wait-1, 1); ok {
		t.Fatal("passed before the wait")
	}
	if ok, _ := b.Take(t0+wait, 1); !ok {
		t.Fatal("refused after the wait")
	}
	if r := b.Remaining(t0 + wait + Window/2); r != 5 {
		t.Fatalf("remaining half a Window later: %d, want 5", r)
	}
	if r := b.Remaining(t0 + 10*Window); r != 10 {
		t.Fatalf("remaining long after: %d", r)
	}
	// Idle time does not bank: a full bucket still takes only n at once.
	got := 0
	for {
		if ok, _ := b.Take(t0+10*Window, 1); !ok {
			break
		}
		got++
	}
	if got != 10 {
		t.Fatalf("after idling %d taken, want 10", got)
	}
}

// TestBucketGiveAndForce: what is given back can be taken again, never beyond full; what is forced is
// charged even past empty and delays later takes.
func TestBucketGiveAndForce(t *testing.T) {
	b := NewBucket(100)
	b.Take(t0, 80)
	b.Give(t0, 30)
	if r := b.Remaining(t0); r != 50 {
		t.Fatalf("after take 80, give 30: remaining %d", r)
	}
	b.Give(t0, 1000)
	if r := b.Remaining(t0); r != 100 {
		t.Fatalf("a large give: remaining %d, want full", r)
	}
	b.Force(t0, 150)
	if r := b.Remaining(t0); r != 0 {
		t.Fatalf("forced past empty: remaining %d", r)
	}
	if ok, wait := b.Take(t0, 1); ok || wait != Window/2+Window/100 {
		t.Fatalf("take after a force of 150 of 100: ok %v wait %d", ok, wait)
	}
}

func twoScopes() (*Scope, *Scope) {
	return NewScope(`key "k"`, 10, 1000, 4), NewScope(`org "o"`, 100, 500, 0)
}

// TestReservationRefusalGivesBack: a request one scope refuses leaves the scopes before it as they were:
// its place in flight, its request and its tokens given back.
func TestReservationRefusalGivesBack(t *testing.T) {
	key, org := twoScopes()
	var r Reservation
	r.Add(key)
	r.Add(org)
	ref, ok := r.Admit(t0, 600) // the key holds 1000 tokens, the org 500
	if ok || ref.Scope != org || ref.Kind != KindTokens || ref.Asked != 600 || ref.Wait != -1 {
		t.Fatalf("refusal %+v ok %v", ref, ok)
	}
	if key.InFlight.InFlight() != 0 || key.Requests.Remaining(t0) != 10 || key.Tokens.Remaining(t0) != 1000 ||
		org.Requests.Remaining(t0) != 100 {
		t.Fatalf("after the refusal: key in flight %d, requests %d, tokens %d; org requests %d", key.InFlight.InFlight(),
			key.Requests.Remaining(t0), key.Tokens.Remaining(t0), org.Requests.Remaining(t0))
	}
}

// TestReservationSettles: an admitted request holds its place, one request and its reservation; settling
// gives back the place and what it did not use, or charges what it used beyond; settling twice does
// nothing.
func TestReservationSettles(t *testing.T) {
	key, org := twoScopes()
	var r Reservation
	r.Add(key)
	r.Add(org)
	if _, ok := r.Admit(t0, 300); !ok {
		t.Fatal("refused")
	}
	if key.InFlight.InFlight() != 1 || org.Tokens.Remaining(t0) != 200 {
		t.Fatalf("admitted: in flight %d, org tokens %d", key.InFlight.InFlight(), org.Tokens.Remaining(t0))
	}
	st := r.Status(t0)
	if st.Requests != (LimitStatus{Limit: 10, Remaining: 9, Reset: Window / 10}) || st.Tokens.Limit != 500 || st.Tokens.Remaining != 200 {
		t.Fatalf("status %+v", st)
	}
	r.Settle(t0, 100)
	r.Settle(t0, 100)
	if key.InFlight.InFlight() != 0 || org.Tokens.Remaining(t0) != 400 || key.Tokens.Remaining(t0) != 900 || key.Requests.Remaining(t0) != 9 {
		t.Fatalf("settled at 100: in flight %d, org tokens %d, key tokens %d, key requests %d", key.InFlight.InFlight(),
			org.Tokens.Remaining(t0), key.Tokens.Remaining(t0), key.Requests.Remaining(t0))
	}
	r.Reset()
	r.Add(org)
	r.Admit(t0, 100)
	r.Settle(t0, 450) // 350 over its reservation
	if rem := org.Tokens.Remaining(t0); rem != 0 {
		t.Fatalf("settled over: org tokens %d", rem)
	}
}

// TestConcurrentReservationsBound: 64 concurrent requests of a tokens-per-minute limit, each reserving its
// cost before it runs, never use more within a Window than the limit while none uses more than it
// reserved; when each uses more, the excess is bounded by the overruns of the requests admitted at once.
func TestConcurrentReservationsBound(t *testing.T) {
	const limit, reserve = 10_000, 300
	s := NewScope(`key "k"`, 0, limit, 0)
	var used, overrun atomic.Int64
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			for range 20 {
				var r Reservation
				r.Add(s)
				if _, ok := r.Admit(t0, reserve); !ok {
					continue
				}
				u := rng.Int64N(reserve + 1)
				used.Add(u)
				r.Settle(t0, u)
			}
		}()
	}
	wg.Wait()
	if used.Load() > limit {
		t.Fatalf("used %d of a limit of %d with no request over its reservation", used.Load(), limit)
	}
	// Requests that use more than they reserved: the first settles past the limit, then every
	// reservation is refused until the bucket refills.
	s = NewScope(`key "k"`, 0, limit, 0)
	used.Store(0)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				var r Reservation
				r.Add(s)
				if _, ok := r.Admit(t0, reserve); !ok {
					continue
				}
				used.Add(2 * reserve)
				overrun.Add(reserve)
				r.Settle(t0, 2*reserve)
			}
		}()
	}
	wg.Wait()
	// Admissions only pass while what was charged is under the limit: each admitted reservation is
	// within the limit when taken, and its overrun lands later, so what is used stays under the limit
	// plus the overruns of the requests in flight at once (64 here).
	if u := used.Load(); u > limit+64*reserve {
		t.Fatalf("used %d of a limit of %d", u, limit)
	}
}

func TestAppendDuration(t *testing.T) {
	for ns, want := range map[int64]string{
		0: "0ms", 1: "1ms", 20e6: "20ms", 999e6: "999ms", 1e9: "1s", 1.5e9: "1.5s", 1.05e9: "1.05s",
		60e9: "1m0s", 360e9: "6m0s", 3723.5e9: "1h2m3.5s", 7200e9: "2h0m0s", -5: "0ms",
	} {
		if got := string(AppendDuration(nil, ns)); got != want {
			t.Errorf("%d ns: %q, want %q", ns, got, want)
		}
	}
	if RetryAfterSeconds(1) != 1 || RetryAfterSeconds(1e9) != 1 || RetryAfterSeconds(1e9+1) != 2 || RetryAfterSeconds(0) != 1 {
		t.Error("RetryAfterSeconds")
	}
}

// TestAllocs: admission, status, headers and settling allocate nothing.
func TestAllocs(t *testing.T) {
	key, org := twoScopes()
	buf := make([]byte, 0, 64)
	n := testing.AllocsPerRun(1000, func() {
		var r Reservation
		r.Add(key)
		r.Add(org)
		if _, ok := r.Admit(t0, 1); ok {
			st := r.Status(t0)
			buf = AppendDuration(buf[:0], st.Tokens.Reset)
			r.Settle(t0, 0)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocs per request", n)
	}
}

// BenchmarkAdmitSettle is one request's limit check and settlement against a key and an org, from every
// core at once (one key: the contended case).
func BenchmarkAdmitSettle(b *testing.B) {
	key := NewScope(`key "k"`, 1<<40, 1<<40, 1<<20)
	org := NewScope(`org "o"`, 1<<40, 1<<40, 0)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			var r Reservation
			r.Add(key)
			r.Add(org)
			if _, ok := r.Admit(t0, 100); !ok {
				b.Fatal("refused")
			}
			r.Settle(t0, 50)
		}
	})
}

// TestShare: a bucket holding a share of its limit takes ceil(n / of) at once; a take over the share but
// within the limit passes only on a full bucket, and empties it for that long; a gauge's places shrink
// the same way.
func TestShare(t *testing.T) {
	b := NewBucket(10)
	b.SetShare(3)
	if b.Share() != 4 || b.Limit() != 10 || b.Remaining(t0) != 4 {
		t.Fatalf("share %d limit %d remaining %d", b.Share(), b.Limit(), b.Remaining(t0))
	}
	got := 0
	for {
		if ok, _ := b.Take(t0, 1); !ok {
			break
		}
		got++
	}
	if got != 4 {
		t.Fatalf("a third of 10 took %d", got)
	}
	big := NewBucket(1000)
	big.SetShare(4)
	if ok, _ := big.Take(t0, 400); !ok {
		t.Fatal("a take over the share refused on a full bucket")
	}
	// 400 of a share of 250 a minute is 96 s of it: one more unit passes 36.24 s later.
	if ok, wait := big.Take(t0, 1); ok || wait != Window/250*401-Window {
		t.Fatalf("after a take of 400 from a share of 250: ok %v wait %d", ok, wait)
	}
	if ok, wait := big.Take(t0+Window, 400); ok || wait != Window/250*400-Window {
		t.Fatalf("a second take of 400 before the bucket is full: ok %v wait %d", ok, wait)
	}
	g := NewGauge(5)
	g.SetShare(2)
	places := 0
	for g.Acquire() {
		places++
	}
	if places != 3 {
		t.Fatalf("a gauge of 5 shared by 2 holds %d, want 3", places)
	}
}
