//go:build !race

package accesslog

import (
	"os"
	"testing"
	"time"
)

func TestLogAllocs(t *testing.T) {
	c := enabledConfig(os.DevNull)
	c.Sample = 0.5
	c.SlowMs = 100
	for _, queue := range []int{4096, 1} { // room in the queue, and a full queue that drops
		c.QueueSize = queue
		l := mustNew(t, c)
		r := exampleRecord()
		n := testing.AllocsPerRun(1000, func() {
			if l.Want(time.Second, 42) {
				l.Log(r)
			}
		})
		if n != 0 {
			t.Fatalf("queue %d: Want+Log allocate %v times per call; want 0", queue, n)
		}
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %s", err)
		}
	}
}

func TestFormatAllocs(t *testing.T) {
	r := exampleRecord()
	r.SetRequestID([]byte("id\n\"\xff\u2028"))
	buf := make([]byte, 0, 4096)
	n := testing.AllocsPerRun(100, func() {
		buf = AppendJSON(buf[:0], r)
		buf = AppendText(buf[:0], r)
	})
	if n != 0 {
		t.Fatalf("AppendJSON+AppendText allocate %v times per record; want 0", n)
	}
}
