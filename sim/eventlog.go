package sim

// eventLog collects the events of the current engine step, already encoded, until the publisher
// takes them as one batch. Not safe for concurrent use: guarded by the engine mutex.
type eventLog struct {
	format format
	mode   HashMode

	buf     []byte // n encoded events back to back
	n       int
	restart bool // the publisher must restart its sequence at 0 before the next batch

	notify chan struct{} // capacity 1: wakes the publisher
	one    [1]blockHash
}

func newEventLog(era Era, mode HashMode) *eventLog {
	return &eventLog{
		format: eraFormats[era],
		mode:   mode,
		notify: make(chan struct{}, 1),
	}
}

func (l *eventLog) stored(ev *storedEvent) {
	l.buf = appendBlockStored(l.buf, l.format, l.mode, ev)
	l.added()
}

func (l *eventLog) removed(h blockHash) {
	l.one[0] = h
	l.buf = appendBlockRemoved(l.buf, l.format, l.mode, l.one[:])
	l.added()
}

// reset drops the pending events and queues AllBlocksCleared as the first batch of a new
// sequence, as a restarted engine would start.
func (l *eventLog) reset() {
	l.buf = appendAllBlocksCleared(l.buf[:0], l.format)
	l.n = 1
	l.restart = true
	l.signal()
}

func (l *eventLog) added() {
	l.n++
	if l.n == 1 {
		l.signal()
	}
}

func (l *eventLog) signal() {
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

// take returns the pending events and hands spare (an emptied buffer of the caller) to the log
// for the next step. The returned bytes belong to the caller.
func (l *eventLog) take(spare []byte) (events []byte, n int, restart bool) {
	events, n, restart = l.buf, l.n, l.restart
	l.buf, l.n, l.restart = spare[:0], 0, false
	return events, n, restart
}
