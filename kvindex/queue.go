package kvindex

import (
	"sync"
	"time"
)

const (
	// maxQueuedMessages bounds a target's queue in messages: vLLM's own PUB high-water mark, so the queue
	// never holds more than the publisher itself would buffer for a slow subscriber.
	maxQueuedMessages = 100_000
	// queuedOverhead is charged to the byte bound for every queued message besides its payload: the Go
	// allocations that hold it (the frames' slice headers and size-class rounding, ~100 bytes) and its two
	// queue slots (64 bytes each), so that many tiny messages fill the bound as surely as a few large ones.
	queuedOverhead = 256
)

// queued is one received batch, or (lost > 0) a marker for lost batches dropped at this point of the stream.
type queued struct {
	seq     uint64
	payload []byte
	at      time.Time
	lost    uint64
}

// msgQueue carries batches from a target's reader goroutine, which owns the SUB socket and must keep
// draining it, to its applier goroutine, which owns the Stream and may block for a whole replay. It is
// bounded in messages and in bytes (payload plus queuedOverhead each, counted until the applier starts
// applying the message, so at most one message more is held). push never blocks: a message that does not
// fit is dropped and leaves a loss marker at its place in the order, so the applier meets the loss exactly
// where the batch would have been.
//
// push is called by one goroutine and take/release by one other; signal wakes the taker. Safe for that
// concurrent use.
type msgQueue struct {
	maxBytes int64
	maxMsgs  int
	signal   chan struct{}

	mu    sync.Mutex
	items []queued
	bytes int64 // charged bytes of the messages pushed and not yet released
	msgs  int   // messages pushed and not yet released (markers not included)
}

func newMsgQueue(maxBytes int64, maxMsgs int) *msgQueue {
	return &msgQueue{maxBytes: maxBytes, maxMsgs: maxMsgs, signal: make(chan struct{}, 1)}
}

func charge(payload []byte) int64 {
	return int64(len(payload)) + queuedOverhead
}

// push queues the batch seq; it reports false when the queue was full and the batch was dropped (a loss
// marker took its place). payload is owned by the queue from now on.
func (q *msgQueue) push(seq uint64, payload []byte, at time.Time) bool {
	c := charge(payload)
	q.mu.Lock()
	ok := q.msgs < q.maxMsgs && q.bytes+c <= q.maxBytes
	if ok {
		q.items = append(q.items, queued{seq: seq, payload: payload, at: at})
		q.bytes += c
		q.msgs++
	} else if n := len(q.items); n > 0 && q.items[n-1].lost > 0 {
		// Consecutive losses share one marker, so markers never outnumber the messages between them.
		q.items[n-1].lost++
	} else {
		q.items = append(q.items, queued{lost: 1})
	}
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
	return ok
}

// take moves every queued item into dst[:0] and returns it, in push order. The items stay charged until
// release.
func (q *msgQueue) take(dst []queued) []queued {
	q.mu.Lock()
	items := q.items
	q.items = dst[:0]
	q.mu.Unlock()
	return items
}

// release frees the bytes and the slot of a message returned by take; call it when starting to apply it.
func (q *msgQueue) release(it *queued) {
	if it.lost > 0 {
		return
	}
	c := charge(it.payload)
	q.mu.Lock()
	q.bytes -= c
	q.msgs--
	q.mu.Unlock()
}

// usage returns the queued messages and their charged bytes.
func (q *msgQueue) usage() (msgs int, bytes int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.msgs, q.bytes
}
