package fleet

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/rolter-ai/rolter/loadtest"
	"github.com/rolter-ai/rolter/sim"
)

func TestSummarizeInflight(t *testing.T) {
	var samples [][]int
	for i := 0; i < 10; i++ {
		samples = append(samples, []int{4, 2, 0})
	}
	samples[0] = []int{100, 100, 100} // ramp-up and drain are left out
	samples[9] = []int{0, 0, 0}
	s := SummarizeInflight(samples, 3)
	if s.Samples != 8 || s.Mean[0] != 4 || s.Mean[1] != 2 || s.Mean[2] != 0 || s.MaxMin != -1 || s.Idle != 1 {
		t.Fatalf("got %+v", s)
	}
	for i := range samples {
		samples[i] = []int{3, 2, 2}
	}
	if s := SummarizeInflight(samples, 3); s.MaxMin != 1.5 || s.Idle != 0 {
		t.Fatalf("got %+v", s)
	}
}

func TestGroupSpread(t *testing.T) {
	samples := []loadtest.Sample{
		{Group: 0, Target: "a"}, {Group: 0, Target: "a"}, {Group: 1, Target: "a"}, {Group: 1, Target: "b"},
		{Group: 2, Target: "c", Error: "x"}, {Group: -1, Target: "d"},
	}
	split, mean := GroupSpread(samples)
	if split != 1 || mean != 1.5 {
		t.Fatalf("split %d mean %v, want 1, 1.5", split, mean)
	}
}

func TestFleetConfig(t *testing.T) {
	// A config for an unknown strategy parses up to the strategy check: the report relies on the
	// gateway's wording to tell "not in this build" from a broken config.
	f, err := Start(1, sim.Config{}, "no_such_strategy", discardLogger())
	if err == nil {
		f.Stop()
		t.Fatal("unknown strategy accepted")
	}
	if !strings.Contains(err.Error(), "not available in this build") {
		t.Fatalf("got %v", err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
