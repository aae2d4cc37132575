package telemetry

import (
	"slices"
	"sync/atomic"
)

// Adapters is what one engine holds of its LoRA adapters, from two sources: the batch (the newest
// vllm:lora_requests_info of its /metrics, stored by a Scraper with ScrapeConfig.Adapters) says which
// adapters running and waiting requests use, and the model list (GET /v1/models, stored by a
// ModelsPoller) says which adapters are registered, that is loaded and servable.
//
// Each store builds an immutable view, maps included, and swaps it in with an atomic pointer, so the
// reads routing makes on every request (Running, Waiting, Registered, Lookup, MaxLoRA, RunningCount)
// take no lock and do not allocate. A caller holding the name as a []byte (from the request body) should
// use Lookup: Go copies string(b) to the heap when it is longer than 32 bytes and passed to a function,
// while a map index with string(b) inside Lookup never copies.
// Every read takes the caller's clock and a maximum age with EngineLoad's rule: a source that failed,
// or whose last store is maxAge nanoseconds old or older at now, answers false (or 0).
//
// All methods are safe for concurrent use. An Adapters must not be copied.
type Adapters struct {
	_      noCopy
	batch  atomic.Pointer[batchView]
	models atomic.Pointer[modelsView]
}

// batchView is one stored LoRASample.
type batchView struct {
	at      int64
	seen    bool
	maxLoRA int
	running map[string]struct{}
	waiting map[string]struct{}
	sample  LoRASample // sorted names, shared read-only with View
}

// modelsView is one stored ModelList.
type modelsView struct {
	at         int64
	registered map[string]struct{}
	names      []string // sorted adapter names, shared read-only with View
}

// StoreBatch records the LoRA sample of a successful scrape taken at now (unix nanoseconds). A sample
// that was not seen is stored too: the scrape succeeded, and the engine reports no batch.
// The Adapters keeps s's slices; the caller must not modify them afterwards.
func (a *Adapters) StoreBatch(s LoRASample, now int64) {
	v := &batchView{at: now, seen: s.Seen, sample: s}
	if s.Seen {
		v.maxLoRA = s.MaxLoRA
		v.running = nameSet(s.Running)
		v.waiting = nameSet(s.Waiting)
	}
	a.batch.Store(v)
}

// InvalidateBatch drops the batch: until the next StoreBatch, batch reads answer false. A failed scrape
// calls it at once.
func (a *Adapters) InvalidateBatch() { a.batch.Store(nil) }

// StoreModels records the model list of a successful poll sent at now (unix nanoseconds). The
// Adapters keeps m's slices; the caller must not modify them afterwards.
func (a *Adapters) StoreModels(m ModelList, now int64) {
	v := &modelsView{at: now, registered: make(map[string]struct{}, len(m.Adapters))}
	for _, c := range m.Adapters {
		v.registered[c.Name] = struct{}{}
		v.names = append(v.names, c.Name)
	}
	slices.Sort(v.names)
	a.models.Store(v)
}

// InvalidateModels drops the model list: until the next StoreModels, Registered answers false. A
// failed poll calls it at once.
func (a *Adapters) InvalidateModels() { a.models.Store(nil) }

// Running reports whether a running request of the last fresh batch uses the adapter name.
func (a *Adapters) Running(name string, now, maxAge int64) bool {
	v := a.freshBatch(now, maxAge)
	if v == nil {
		return false
	}
	_, ok := v.running[name]
	return ok
}

// Waiting reports whether a waiting request of the last fresh batch uses the adapter name.
func (a *Adapters) Waiting(name string, now, maxAge int64) bool {
	v := a.freshBatch(now, maxAge)
	if v == nil {
		return false
	}
	_, ok := v.waiting[name]
	return ok
}

// AdapterState is what one engine holds of one adapter, as Lookup reads it.
type AdapterState struct {
	Running    bool // a running request of the fresh batch uses it
	Waiting    bool // a waiting request of the fresh batch uses it
	Registered bool // the fresh model list has it
}

// Lookup returns the three answers of Running, Waiting and Registered for name in one call. name is
// only read during the call; Lookup does not allocate whatever its length.
func (a *Adapters) Lookup(name []byte, now, maxAge int64) AdapterState {
	var st AdapterState
	if v := a.freshBatch(now, maxAge); v != nil {
		_, st.Running = v.running[string(name)]
		_, st.Waiting = v.waiting[string(name)]
	}
	if v := a.models.Load(); v != nil && isFresh(v.at, now, maxAge) {
		_, st.Registered = v.registered[string(name)]
	}
	return st
}

// RunningCount returns how many distinct adapters the running requests of the last fresh batch use;
// 0 when the batch is unknown.
func (a *Adapters) RunningCount(now, maxAge int64) int {
	v := a.freshBatch(now, maxAge)
	if v == nil {
		return 0
	}
	return len(v.running)
}

// MaxLoRA returns the engine's max_loras from the last fresh batch; ok is false when the batch is
// unknown or does not say.
func (a *Adapters) MaxLoRA(now, maxAge int64) (int, bool) {
	v := a.freshBatch(now, maxAge)
	if v == nil || v.maxLoRA <= 0 {
		return 0, false
	}
	return v.maxLoRA, true
}

// Registered reports whether the last fresh model list has the adapter name (a card with a parent).
func (a *Adapters) Registered(name string, now, maxAge int64) bool {
	v := a.models.Load()
	if v == nil || !isFresh(v.at, now, maxAge) {
		return false
	}
	_, ok := v.registered[name]
	return ok
}

// ModelsAt returns when the fresh model list was read (unix nanoseconds); ok is false when there is none.
func (a *Adapters) ModelsAt(now, maxAge int64) (at int64, ok bool) {
	v := a.models.Load()
	if v == nil || !isFresh(v.at, now, maxAge) {
		return 0, false
	}
	return v.at, true
}

// AdapterView is a snapshot of an Adapters for the state API. Its slices are sorted and shared with
// the Adapters: they are valid forever and must not be modified.
type AdapterView struct {
	Registered []string
	Running    []string
	Waiting    []string
	MaxLoRA    int
	// BatchKnown is true when a fresh scrape carried a LoRA series; ModelsKnown when a fresh model list
	// is stored.
	BatchKnown  bool
	ModelsKnown bool
}

// View returns the fresh state of a under the rule of the other reads. It does not allocate.
func (a *Adapters) View(now, maxAge int64) AdapterView {
	var av AdapterView
	if v := a.freshBatch(now, maxAge); v != nil {
		av.BatchKnown = true
		av.Running, av.Waiting, av.MaxLoRA = v.sample.Running, v.sample.Waiting, v.maxLoRA
	}
	if v := a.models.Load(); v != nil && isFresh(v.at, now, maxAge) {
		av.ModelsKnown = true
		av.Registered = v.names
	}
	return av
}

// freshBatch returns the stored batch when it was seen and is fresh, else nil.
func (a *Adapters) freshBatch(now, maxAge int64) *batchView {
	v := a.batch.Load()
	if v == nil || !v.seen || !isFresh(v.at, now, maxAge) {
		return nil
	}
	return v
}

// isFresh is EngineLoad's age rule: maxAge <= 0 disables the check.
func isFresh(at, now, maxAge int64) bool {
	return maxAge <= 0 || now-at < maxAge
}

func nameSet(names []string) map[string]struct{} {
	m := make(map[string]struct{}, len(names))
	for _, n := range names {
		m[n] = struct{}{}
	}
	return m
}

// noCopy makes go vet's copylocks check report a copied Adapters.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
