package kvindex

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestMsgQueue(t *testing.T) {
	// ops: n >= 0 pushes a message of n payload bytes, -1 takes and releases everything. want renders the
	// takes, "|" between them: a message as its payload length, a loss marker as "xN" (N lost messages).
	f := func(maxBytes int64, maxMsgs int, ops []int, wantPushed []bool, want string) {
		t.Helper()
		q := newMsgQueue(maxBytes, maxMsgs)
		var pushed []bool
		var takes []string
		var items []queued
		for _, op := range ops {
			if op >= 0 {
				pushed = append(pushed, q.push(uint64(len(pushed)), make([]byte, op), time.Time{}))
				continue
			}
			items = q.take(items)
			var got []string
			for i := range items {
				it := &items[i]
				if it.lost > 0 {
					got = append(got, "x"+strconv.FormatUint(it.lost, 10))
				} else {
					got = append(got, strconv.Itoa(len(it.payload)))
				}
				q.release(it)
			}
			takes = append(takes, strings.Join(got, " "))
		}
		if msgs, bytes := q.usage(); msgs != 0 || bytes != 0 {
			t.Fatalf("%v: %d messages, %d bytes left after releasing everything", ops, msgs, bytes)
		}
		if got := strings.Join(takes, " | "); !slices.Equal(pushed, wantPushed) || got != want {
			t.Fatalf("%v: pushed %v, took %q; want %v, %q", ops, pushed, got, wantPushed, want)
		}
	}
	o := queuedOverhead
	// Bytes: payload plus the per-message charge.
	f(int64(3*(100+o)), 10, []int{100, 100, 100, 100, -1}, []bool{true, true, true, false}, "100 100 100 x1")
	f(int64(2*(100+o)), 10, []int{100, 101, 99, -1}, []bool{true, false, true}, "100 x1 99")
	// Messages, even empty ones; consecutive losses share one marker.
	f(1<<20, 2, []int{0, 0, 0, 0, -1}, []bool{true, true, false, false}, "0 0 x2")
	// A marker keeps its place in the order; release frees the bound for what follows.
	f(1<<20, 1, []int{5, 6, 7, -1, 8, -1}, []bool{true, false, false, true}, "5 x2 | 8")
	f(1<<20, 1, []int{5, -1, 6, 7, -1}, []bool{true, true, false}, "5 | 6 x1")
	f(1<<20, 1, []int{-1, 5, 6, -1, 7, -1}, []bool{true, false, true}, " | 5 x1 | 7")
}
