package control

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rolter-ai/rolter/control/store"
	"github.com/rolter-ai/rolter/engine"
)

// UsageFlushInterval is how often a UsageFlusher stores what the gateway's keys used: usage is durable
// within it, and at shutdown.
const UsageFlushInterval = 10 * time.Second

// maxUsageRange is the longest range GET .../usage reads: 93 days, a quarter.
const maxUsageRange = 93 * 24 * time.Hour

// usageSlot names the usage one flush keeps until the store has it: a key's use of a model in one hour.
type usageSlot struct {
	hour            time.Time
	org, key, model string
}

// usageBook is the usage drained from the gateway and not stored yet (a store error keeps it for the next
// flush), merged by slot: it grows with the keys and models used, one set per hour the store is down.
type usageBook struct {
	mu      sync.Mutex
	buf     []engine.UsageRow
	pending map[usageSlot]store.UsageCounts
}

// FlushUsage drains what the gateway's keys used since the last drain, under the current UTC hour, and
// adds it, with whatever an earlier flush could not store, to the store. On an error what it could not
// store is kept for the next flush: nothing the data plane counted is lost while the process runs.
func (s *Server) FlushUsage(ctx context.Context) error {
	if s.drainUsage == nil {
		return nil
	}
	b := &s.usage
	b.mu.Lock()
	defer b.mu.Unlock()
	hour := store.UsageHour(time.Now())
	b.buf = s.drainUsage(b.buf[:0])
	for _, r := range b.buf {
		id := usageSlot{hour: hour, org: r.Org, key: r.Key, model: r.Model}
		c := b.pending[id]
		c.Add(store.UsageCounts{Requests: r.Requests, Refused: r.Refused, PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, CompletionTokens: r.CompletionTokens})
		if b.pending == nil {
			b.pending = map[usageSlot]store.UsageCounts{}
		}
		b.pending[id] = c
	}
	byHour := map[time.Time][]store.UsageRow{}
	for id, c := range b.pending {
		byHour[id.hour] = append(byHour[id.hour], store.UsageRow{OrgID: id.org, KeyID: id.key, Model: id.model, Hour: id.hour, UsageCounts: c})
	}
	hours := slices.SortedFunc(maps.Keys(byHour), time.Time.Compare)
	for _, h := range hours {
		if err := s.store.AddUsage(ctx, h, byHour[h]); err != nil {
			return fmt.Errorf("cannot store the keys' usage (kept for the next flush): %w", err)
		}
		for _, r := range byHour[h] {
			delete(b.pending, usageSlot{hour: h, org: r.OrgID, key: r.KeyID, model: r.Model})
		}
	}
	return nil
}

// UsageFlusher stores the gateway's usage every interval (Server.FlushUsage) and once more at Stop. With
// many gateways on one PostgreSQL store each flushes its own counts, which the store sums.
type UsageFlusher struct {
	srv      *Server
	interval time.Duration
	log      *slog.Logger
	cancel   context.CancelFunc
	done     chan struct{}
}

// NewUsageFlusher returns a flusher of srv's usage every interval (UsageFlushInterval when 0); Start
// starts it.
func NewUsageFlusher(srv *Server, interval time.Duration, log *slog.Logger) *UsageFlusher {
	if interval <= 0 {
		interval = UsageFlushInterval
	}
	if log == nil {
		log = srv.log
	}
	return &UsageFlusher{srv: srv, interval: interval, log: log.With("component", "control")}
}

// Start starts flushing in the background.
func (f *UsageFlusher) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan struct{})
	go func() {
		defer close(f.done)
		defer func() {
			if p := recover(); p != nil {
				f.log.Error("BUG: the usage flusher panicked; usage is no longer stored", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
		}()
		t := time.NewTicker(f.interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f.flush(f.interval)
			}
		}
	}()
}

// Stop stops the flushing and stores what is left: the caller stops the data plane first, so the last
// flush has every request it answered.
func (f *UsageFlusher) Stop() {
	if f.cancel != nil {
		f.cancel()
		<-f.done
	}
	f.flush(10 * time.Second)
}

func (f *UsageFlusher) flush(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := f.srv.FlushUsage(ctx); err != nil {
		f.log.Error("cannot store the keys' usage; retrying at the next flush", "error", err.Error())
	}
}

// usageGroups are the group_by dimensions of GET .../usage.
var usageGroups = []string{"hour", "day", "key", "model"}

// usageQuery is a usage request's parameters: the hours that overlap [from, to), grouped by the
// dimensions set.
type usageQuery struct {
	from, to                  time.Time
	groupBy                   []string
	hour, day, byKey, byModel bool
}

// parseUsageQuery reads ?from=&to=&group_by= (RFC 3339 times; one or more of hour, day, key and model,
// comma-separated): the last 24 hours by hour without any.
func parseUsageQuery(r *http.Request, now time.Time) (usageQuery, error) {
	q := r.URL.Query()
	bad := func(format string, args ...any) (usageQuery, error) {
		return usageQuery{}, errorf(http.StatusBadRequest, "invalid_request", format, args...)
	}
	var u usageQuery
	u.to = now
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"from", &u.from}, {"to", &u.to}} {
		if v := q.Get(p.name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return bad("cannot use %s %q: want an RFC 3339 time, such as 2026-03-01T00:00:00Z", p.name, v)
			}
			*p.t = t.UTC()
		}
	}
	if q.Get("from") == "" {
		u.from = u.to.Add(-24 * time.Hour)
	}
	switch {
	case u.from.After(u.to):
		return bad("from %s is after to %s", timestamp(u.from), timestamp(u.to))
	case u.to.Sub(u.from) > maxUsageRange:
		return bad("the range from %s to %s is longer than %d days", timestamp(u.from), timestamp(u.to), int(maxUsageRange/(24*time.Hour)))
	}
	g := q.Get("group_by")
	if g == "" {
		g = "hour"
	}
	for _, d := range strings.Split(g, ",") {
		var seen *bool
		switch d {
		case "hour":
			seen = &u.hour
		case "day":
			seen = &u.day
		case "key":
			seen = &u.byKey
		case "model":
			seen = &u.byModel
		default:
			return bad("cannot group usage by %q: want one or more of %s, comma-separated", d, strings.Join(usageGroups, ", "))
		}
		if *seen {
			return bad("group_by %q names %s twice", g, d)
		}
		*seen = true
		u.groupBy = append(u.groupBy, d)
	}
	if u.hour && u.day {
		return bad("group_by %q has both hour and day: want one of them", g)
	}
	return u, nil
}

// usageView is one row of GET .../usage (openapi.json's Usage): the usage of an org, in a time bucket
// (start, by hour or day) for a key and a model, as group_by asks; what it does not group by is omitted.
type usageView struct {
	Org              string `json:"org"`
	Start            string `json:"start,omitempty"`
	Key              string `json:"key,omitempty"`
	Model            string `json:"model,omitempty"`
	Requests         int64  `json:"requests"`
	Refused          int64  `json:"refused"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
}

// usageAnswer is GET .../usage's answer (openapi.json's UsageList).
type usageAnswer struct {
	From    string      `json:"from"`
	To      string      `json:"to"`
	GroupBy []string    `json:"group_by"`
	Data    []usageView `json:"data"`
}

// group sums rows by the dimensions of u, sorted by org, start, key and model.
func (u usageQuery) group(rows []store.UsageRow) []usageView {
	type groupID struct {
		org        string
		start      time.Time
		key, model string
	}
	sums := map[groupID]*store.UsageCounts{}
	var ids []groupID
	for _, r := range rows {
		id := groupID{org: r.OrgID}
		switch {
		case u.hour:
			id.start = r.Hour
		case u.day:
			id.start = r.Hour.Truncate(24 * time.Hour) // UTC: Unix time's days start at midnight UTC
		}
		if u.byKey {
			id.key = r.KeyID
		}
		if u.byModel {
			id.model = r.Model
		}
		c, ok := sums[id]
		if !ok {
			c = &store.UsageCounts{}
			sums[id] = c
			ids = append(ids, id)
		}
		c.Add(r.UsageCounts)
	}
	slices.SortFunc(ids, func(a, b groupID) int {
		return cmp.Or(cmp.Compare(a.org, b.org), a.start.Compare(b.start), cmp.Compare(a.key, b.key), cmp.Compare(a.model, b.model))
	})
	out := make([]usageView, len(ids))
	for i, id := range ids {
		c := sums[id]
		v := usageView{Org: id.org, Key: id.key, Model: id.model, Requests: c.Requests, Refused: c.Refused,
			PromptTokens: c.PromptTokens, CachedTokens: c.CachedTokens, CompletionTokens: c.CompletionTokens}
		if u.hour || u.day {
			v.Start = timestamp(id.start)
		}
		out[i] = v
	}
	return out
}

// writeUsage answers the usage of org ("" for every org): what this gateway counted is stored first, so
// the answer has every request it answered (other gateways' within their flush interval).
func (s *Server) writeUsage(w http.ResponseWriter, r *http.Request, org string) error {
	u, err := parseUsageQuery(r, time.Now())
	if err != nil {
		return err
	}
	if err := s.FlushUsage(r.Context()); err != nil {
		return err
	}
	var rows []store.UsageRow
	if org != fileOrg {
		if rows, err = s.store.Usage(r.Context(), org, store.UsageHour(u.from), u.to); err != nil {
			return err
		}
	}
	writeJSON(w, http.StatusOK, usageAnswer{From: timestamp(u.from), To: timestamp(u.to), GroupBy: u.groupBy, Data: u.group(rows)})
	return nil
}

// getUsage is the usage of every org (the superadmin's), each row naming its org.
func (s *Server) getUsage(w http.ResponseWriter, r *http.Request, c *caller) error {
	return s.writeUsage(w, r, "")
}

// getOrgUsage is the usage of one existing org.
func (s *Server) getOrgUsage(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org != fileOrg {
		if err := s.orgExists(r.Context(), org); err != nil {
			return err
		}
	}
	return s.writeUsage(w, r, org)
}
