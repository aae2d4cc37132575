package store

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestStoreUsage: added usage sums per org, key, model and hour, whatever the number of writers; reads
// are by org (or all) and hour range, sorted; adding does not move the generation; bad rows are refused
// with nothing added; a deleted org's usage goes with it, and rows for it are dropped.
func TestStoreUsage(t *testing.T) {
	s := testStore(t)
	a, b := mustOrg(t, s, "a"), mustOrg(t, s, "b")
	h0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	h1 := h0.Add(time.Hour)
	c := func(req, ref, p, cached, comp int64) UsageCounts { return UsageCounts{req, ref, p, cached, comp} }
	gen, _ := s.Generation(bg)
	wantErr(t, s.AddUsage(bg, h0.Add(25*time.Minute), []UsageRow{
		{OrgID: a.ID, KeyID: "k1", Model: "m", UsageCounts: c(2, 1, 100, 10, 50)},
		{OrgID: a.ID, KeyID: "k2", Model: "m", UsageCounts: c(1, 0, 7, 0, 3)},
		{OrgID: b.ID, KeyID: "k3", Model: "n", UsageCounts: c(1, 0, 1, 0, 1)},
	}), nil)
	// Many gateways add to the same rows at once.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wantErr(t, s.AddUsage(bg, h0.Add(59*time.Minute), []UsageRow{{OrgID: a.ID, KeyID: "k1", Model: "m", UsageCounts: c(1, 1, 10, 1, 5)}}), nil)
		}()
	}
	wg.Wait()
	wantErr(t, s.AddUsage(bg, h1, []UsageRow{{OrgID: a.ID, KeyID: "k1", Model: "m", UsageCounts: c(1, 0, 1, 0, 1)}}), nil)
	if g, _ := s.Generation(bg); g != gen {
		t.Fatalf("generation %d after adding usage, want %d", g, gen)
	}
	got, err := s.Usage(bg, a.ID, h0, h1.Add(time.Hour))
	wantErr(t, err, nil)
	want := []UsageRow{
		{OrgID: a.ID, KeyID: "k1", Model: "m", Hour: h0, UsageCounts: c(10, 9, 180, 18, 90)},
		{OrgID: a.ID, KeyID: "k2", Model: "m", Hour: h0, UsageCounts: c(1, 0, 7, 0, 3)},
		{OrgID: a.ID, KeyID: "k1", Model: "m", Hour: h1, UsageCounts: c(1, 0, 1, 0, 1)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Usage(a) =\n%+v\nwant\n%+v", got, want)
	}
	if got, _ := s.Usage(bg, a.ID, h1, h1.Add(time.Hour)); len(got) != 1 || got[0].Hour != h1 {
		t.Fatalf("Usage(a, the second hour) = %+v", got)
	}
	all, _ := s.Usage(bg, "", h0, h1)
	if len(all) != 3 || !slices.ContainsFunc(all, func(r UsageRow) bool { return r.OrgID == b.ID && r.KeyID == "k3" }) ||
		!slices.IsSortedFunc(all, func(x, y UsageRow) int { return strings.Compare(x.OrgID, y.OrgID) }) {
		t.Fatalf("Usage(every org, the first hour) = %+v", all)
	}

	for _, bad := range []UsageRow{
		{OrgID: a.ID, KeyID: "", Model: "m"},
		{OrgID: "", KeyID: "k", Model: "m"},
		{OrgID: a.ID, KeyID: "k", Model: ""},
		{OrgID: a.ID, KeyID: "k", Model: "m", UsageCounts: c(0, 0, -1, 0, 0)},
	} {
		wantErr(t, s.AddUsage(bg, h0, []UsageRow{{OrgID: a.ID, KeyID: "k9", Model: "m", UsageCounts: c(1, 0, 0, 0, 0)}, bad}), ErrInvalid)
	}
	if got, _ := s.Usage(bg, a.ID, h0, h1); len(got) != 2 {
		t.Fatalf("a refused AddUsage wrote: %+v", got)
	}

	wantErr(t, s.DeleteOrg(bg, su, b.ID), nil)
	wantErr(t, s.AddUsage(bg, h0, []UsageRow{
		{OrgID: b.ID, KeyID: "k3", Model: "n", UsageCounts: c(1, 0, 1, 0, 1)},
		{OrgID: a.ID, KeyID: "k2", Model: "m", UsageCounts: c(1, 0, 0, 0, 0)},
	}), nil)
	all, _ = s.Usage(bg, "", h0, h1.Add(time.Hour))
	if len(all) != 3 || all[1].Requests != 2 {
		t.Fatalf("after deleting org b: %+v", all)
	}
	if n := count(t, s, "usage"); n != 3 {
		t.Fatalf("%d usage rows after deleting org b, want 3", n)
	}
}
