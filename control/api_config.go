package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
)

// objectKind is what the providers and routes endpoints share: both are versioned config objects of an
// org, kept in the store as JSON and validated as part of the composed config.
type objectKind struct {
	plural string // "providers", "routes": the path segment, and the composed config's key (FieldErrors)
	object string // "provider", "route"
	key    string // "name", "model": the JSON field and path value naming one

	// find returns org's stored object name in st, or ok false; a route is found whatever its org (owner
	// may be another): the public model names are one namespace.
	find func(st *store.State, org, name string) (owner string, raw []byte, version int64, ok bool)
	// with returns a copy of st where org's object name has config (nil: it is gone).
	with func(st *store.State, org, name string, raw []byte) *store.State
	// decode decodes a request body strictly and returns the name it gives ("" if none) and the config to
	// store: the body without the name.
	decode func(body []byte) (name string, raw []byte, err error)
	// view returns the object as the API shows it: the config as the gateway runs it (defaults filled).
	view func(org, name string, raw []byte) (any, error)
	// fileObjects returns the objects of rolter.toml, as the API shows them.
	fileObjects func(file *config.Config) []fileObject

	// The store's methods (a method expression: the store first). write is put (or create, with expect
	// createOnly) returning the object as written.
	write func(s *store.Store, ctx context.Context, actor, org, name string, raw []byte, expect int64) (storedObject, error)
	put   func(s *store.Store, ctx context.Context, actor, org, name string, raw []byte, expect int64) (bool, int64, error)
	del   func(s *store.Store, ctx context.Context, actor, org, name string, expect int64) error
	list  func(s *store.Store, ctx context.Context, org string) ([]storedObject, error)
	get   func(s *store.Store, ctx context.Context, org, name string) (storedObject, error)
}

// storedObject is a provider or route as read from the store.
type storedObject struct {
	name             string
	raw              []byte
	version          int64
	created, updated time.Time
}

// fileObject is a provider or route of rolter.toml.
type fileObject struct {
	name string
	view any
}

// meta are the fields the control plane adds to an object's config in its answers (openapi.json's
// Provider and Route).
type meta struct {
	Org     string `json:"org"`
	Version int64  `json:"version,omitempty"` // absent for the objects of rolter.toml
	Created string `json:"created,omitempty"`
	Updated string `json:"updated,omitempty"`
}

type providerView struct {
	config.ProviderConfig
	meta
}

type routeView struct {
	config.RouteConfig
	meta
	// Suspended says why the route is not served ("" when it is): rolter.toml routes its model (Compose).
	Suspended string `json:"suspended,omitempty"`
}

// readOnlyFields are the fields of meta: shown, never taken.
var readOnlyFields = []string{"org", "version", "created", "updated"}

var providerKind = &objectKind{
	plural: "providers", object: "provider", key: "name",
	find: func(st *store.State, org, name string) (string, []byte, int64, bool) {
		for _, p := range st.Providers {
			if p.OrgID == org && p.Name == name {
				return p.OrgID, p.Config, p.Version, true
			}
		}
		return "", nil, 0, false
	},
	with: func(st *store.State, org, name string, raw []byte) *store.State {
		next := *st
		next.Providers = slices.DeleteFunc(slices.Clone(st.Providers), func(p store.Provider) bool { return p.OrgID == org && p.Name == name })
		if raw != nil {
			next.Providers = append(next.Providers, store.Provider{OrgID: org, Name: name, Config: raw})
		}
		return &next
	},
	decode: func(body []byte) (string, []byte, error) {
		var pc config.ProviderConfig
		if err := decodeObject(body, &pc, readOnlyFields...); err != nil {
			return "", nil, err
		}
		raw, err := withoutField(body, "name")
		return pc.Name, raw, err
	},
	view: func(org, name string, raw []byte) (any, error) {
		var pc config.ProviderConfig
		if err := decodeStrict(raw, &pc); err != nil {
			return nil, fmt.Errorf("cannot decode provider %q of org %q from the store: %w", name, org, err)
		}
		pc.Name = name
		// The defaults are the engine's, set as it sets them for the file.
		cfg := config.Config{Providers: []config.ProviderConfig{pc}}
		cfg.SetDefaults()
		return providerView{ProviderConfig: cfg.Providers[0]}, nil
	},
	fileObjects: func(file *config.Config) []fileObject {
		out := make([]fileObject, len(file.Providers))
		for i, p := range file.Providers {
			out[i] = fileObject{name: p.Name, view: providerView{ProviderConfig: p, meta: meta{Org: fileOrg}}}
		}
		return out
	},
	write: func(s *store.Store, ctx context.Context, actor, org, name string, raw []byte, expect int64) (storedObject, error) {
		p, err := s.WriteProvider(ctx, actor, org, name, raw, expect)
		if err != nil {
			return storedObject{}, err
		}
		return storedObject{p.Name, p.Config, p.Version, p.Created, p.Updated}, nil
	},
	put: (*store.Store).PutProvider,
	del: (*store.Store).DeleteProvider,
	list: func(s *store.Store, ctx context.Context, org string) ([]storedObject, error) {
		ps, err := s.ListProviders(ctx, org)
		out := make([]storedObject, len(ps))
		for i, p := range ps {
			out[i] = storedObject{p.Name, p.Config, p.Version, p.Created, p.Updated}
		}
		return out, err
	},
	get: func(s *store.Store, ctx context.Context, org, name string) (storedObject, error) {
		p, err := s.GetProvider(ctx, org, name)
		return storedObject{p.Name, p.Config, p.Version, p.Created, p.Updated}, err
	},
}

var routeKind = &objectKind{
	plural: "routes", object: "route", key: "model",
	find: func(st *store.State, _, model string) (string, []byte, int64, bool) {
		for _, r := range st.Routes {
			if r.Model == model {
				return r.OrgID, r.Config, r.Version, true
			}
		}
		return "", nil, 0, false
	},
	with: func(st *store.State, org, model string, raw []byte) *store.State {
		next := *st
		next.Routes = slices.DeleteFunc(slices.Clone(st.Routes), func(r store.Route) bool { return r.Model == model })
		if raw != nil {
			next.Routes = append(next.Routes, store.Route{OrgID: org, Model: model, Config: raw})
		}
		return &next
	},
	decode: func(body []byte) (string, []byte, error) {
		var rc config.RouteConfig
		if err := decodeObject(body, &rc, readOnlyFields...); err != nil {
			return "", nil, err
		}
		raw, err := withoutField(body, "model")
		return rc.Model, raw, err
	},
	view: func(org, model string, raw []byte) (any, error) {
		var rc config.RouteConfig
		if err := decodeStrict(raw, &rc); err != nil {
			return nil, fmt.Errorf("cannot decode route %q of org %q from the store: %w", model, org, err)
		}
		rc.Model = model
		cfg := config.Config{Routes: []config.RouteConfig{rc}} // defaults, as for providers
		cfg.SetDefaults()
		return routeView{RouteConfig: cfg.Routes[0]}, nil
	},
	fileObjects: func(file *config.Config) []fileObject {
		out := make([]fileObject, len(file.Routes))
		for i, r := range file.Routes {
			out[i] = fileObject{name: r.Model, view: routeView{RouteConfig: r, meta: meta{Org: fileOrg}}}
		}
		return out
	},
	write: func(s *store.Store, ctx context.Context, actor, org, model string, raw []byte, expect int64) (storedObject, error) {
		r, err := s.WriteRoute(ctx, actor, org, model, raw, expect)
		if err != nil {
			return storedObject{}, err
		}
		return storedObject{r.Model, r.Config, r.Version, r.Created, r.Updated}, nil
	},
	put: (*store.Store).PutRoute,
	del: (*store.Store).DeleteRoute,
	list: func(s *store.Store, ctx context.Context, org string) ([]storedObject, error) {
		rs, err := s.ListRoutes(ctx, org)
		out := make([]storedObject, len(rs))
		for i, r := range rs {
			out[i] = storedObject{r.Model, r.Config, r.Version, r.Created, r.Updated}
		}
		return out, err
	},
	get: func(s *store.Store, ctx context.Context, org, model string) (storedObject, error) {
		r, err := s.GetRoute(ctx, org, model)
		return storedObject{r.Model, r.Config, r.Version, r.Created, r.Updated}, err
	},
}

// withoutField returns body, a JSON object, compacted without its field name (the object's name is its
// key in the store, not part of its config).
func withoutField(body []byte, name string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("BUG: a checked body does not decode: %w", err)
	}
	delete(m, name)
	return json.Marshal(m) // sorted keys, compact values
}

// objectView is a stored object as the API shows it.
func objectView(k *objectKind, org string, o storedObject) (any, error) {
	v, err := k.view(org, o.name, o.raw)
	if err != nil {
		return nil, err
	}
	m := meta{Org: org, Version: o.version, Created: timestamp(o.created), Updated: timestamp(o.updated)}
	switch v := v.(type) {
	case providerView:
		v.meta = m
		return v, nil
	case routeView:
		v.meta = m
		return v, nil
	}
	panic(fmt.Sprintf("BUG: unknown view %T", v))
}

// timestamp formats a store time as RFC 3339 (with milliseconds when it has them).
func timestamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// etag is the entity tag of an object's version (RFC 9110, section 8.8.3): If-Match takes it back.
func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// precondition is an If-Match header: the version a write expects (RFC 9110, section 13.1.1).
type precondition struct {
	version int64 // > 0: exactly this version
	exists  bool  // "*": any version, but it must exist
}

func parseIfMatch(r *http.Request) (precondition, error) {
	h := strings.TrimSpace(r.Header.Get("If-Match"))
	if h == "" {
		return precondition{}, nil
	}
	if h == "*" {
		return precondition{exists: true}, nil
	}
	if v, ok := strings.CutPrefix(h, `"`); ok {
		if v, ok := strings.CutSuffix(v, `"`); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
				return precondition{version: n}, nil
			}
		}
	}
	return precondition{}, errorf(http.StatusBadRequest, "invalid_request", `cannot use If-Match %q: want an ETag this API gave, "<version>", or *`, h)
}

// check returns the conflict of a write with precondition p, given whether the object exists and its
// version.
func (p precondition) check(what string, exists bool, version int64) error {
	switch {
	case p.version > 0 && !exists:
		return errorf(http.StatusConflict, "conflict", "%s: expected version %d, but it does not exist", what, p.version)
	case p.version > 0 && p.version != version:
		return errorf(http.StatusConflict, "conflict", "%s: expected version %d, the stored version is %d", what, p.version, version)
	case p.exists && !exists:
		return errorf(http.StatusConflict, "conflict", "%s: If-Match * but it does not exist", what)
	}
	return nil
}

func (s *Server) listObjects(k *objectKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org := r.PathValue("org")
		var out []any
		if org == fileOrg {
			for _, o := range k.fileObjects(s.file()) {
				out = append(out, o.view)
			}
			writeJSON(w, http.StatusOK, listOf(out))
			return nil
		}
		objs, err := k.list(s.store, r.Context(), org)
		if errors.Is(err, store.ErrNotFound) {
			return errOrgNotFound(org)
		}
		if err != nil {
			return err
		}
		for _, o := range objs {
			v, err := objectView(k, org, o)
			if err != nil {
				return err
			}
			out = append(out, s.withSuspension(v))
		}
		writeJSON(w, http.StatusOK, listOf(out))
		return nil
	}
}

func (s *Server) getObject(k *objectKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org, name := r.PathValue("org"), r.PathValue(k.key)
		if org == fileOrg {
			for _, o := range k.fileObjects(s.file()) {
				if o.name == name {
					writeJSON(w, http.StatusOK, o.view)
					return nil
				}
			}
			return errorf(http.StatusNotFound, "not_found", "rolter.toml has no %s %q", k.object, name)
		}
		o, err := k.get(s.store, r.Context(), org, name)
		if errors.Is(err, store.ErrNotFound) {
			if err := s.orgExists(r.Context(), org); err != nil {
				return err
			}
			return errorf(http.StatusNotFound, "not_found", "org %q has no %s %q", org, k.object, name)
		}
		if err != nil {
			return err
		}
		v, err := objectView(k, org, o)
		if err != nil {
			return err
		}
		w.Header().Set("ETag", etag(o.version))
		writeJSON(w, http.StatusOK, s.withSuspension(v))
		return nil
	}
}

// withSuspension marks a route view that rolter.toml's routes set aside (Compose).
func (s *Server) withSuspension(v any) any {
	rv, ok := v.(routeView)
	if ok && slices.ContainsFunc(s.file().Routes, func(rc config.RouteConfig) bool { return rc.Model == rv.Model }) {
		rv.Suspended = suspendedReason
		return rv
	}
	return v
}

// createObject is POST .../providers and .../routes: the body names the object; one that exists is 409.
func (s *Server) createObject(k *objectKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org := r.PathValue("org")
		if org == fileOrg {
			return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
		}
		body, err := readBody(w, r)
		if err != nil {
			return err
		}
		name, raw, err := k.decode(body)
		if err != nil {
			return err
		}
		if name == "" {
			return fieldError(k.key, missingName(k))
		}
		return s.writeObject(w, r, c, k, org, name, raw, precondition{}, true)
	}
}

// putObject is PUT .../providers/{name} and .../routes/{model}: create or replace, or with If-Match
// replace only that version.
func (s *Server) putObject(k *objectKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org, name := r.PathValue("org"), r.PathValue(k.key)
		if org == fileOrg {
			return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
		}
		cond, err := parseIfMatch(r)
		if err != nil {
			return err
		}
		body, err := readBody(w, r)
		if err != nil {
			return err
		}
		bodyName, raw, err := k.decode(body)
		if err != nil {
			return err
		}
		if bodyName != "" && bodyName != name {
			return fieldError(k.key, fmt.Sprintf("%q differs from the %s in the path, %q: a %s is renamed by creating the new one and deleting the old", bodyName, k.key, name, k.object))
		}
		return s.writeObject(w, r, c, k, org, name, raw, cond, false)
	}
}

func (s *Server) deleteObject(k *objectKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org, name := r.PathValue("org"), r.PathValue(k.key)
		if org == fileOrg {
			return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
		}
		cond, err := parseIfMatch(r)
		if err != nil {
			return err
		}
		return s.writeObject(w, r, c, k, org, name, nil, cond, false)
	}
}

// missingName is the engine's message for an object without its name (one validation path).
func missingName(k *objectKind) string {
	if k == routeKind {
		return "missing public model name"
	}
	return "missing provider name"
}

func fieldError(field, msg string) *apiError {
	e := errorf(http.StatusBadRequest, "invalid_config", "%s: %s", field, msg)
	e.fields = []FieldError{{Field: field, Message: msg}}
	return e
}

// writeObject creates, replaces (config != nil) or deletes (config nil) org's object name, the one way
// every change of a provider or route takes: under s.mu, check the change against the store as it is and
// the live file config (400 for problems of the object, 409 for problems it causes elsewhere), write the
// store, apply; if the gateway refuses, put the store back and answer 422. The answer is written after the
// gateway serves the change.
func (s *Server) writeObject(w http.ResponseWriter, r *http.Request, c *caller, k *objectKind, org, name string, raw []byte, cond precondition, createOnly bool) error {
	if raw != nil {
		if err := store.CheckName(k.object+" "+k.key, name, store.MaxNameLen); err != nil {
			return fieldError(k.key, strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
		}
	}
	// A write that has begun is finished whatever the client does: the store and the gateway must agree.
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	var created bool
	var written storedObject
	var prev []byte
	err := retryStale(func() error {
		var err error
		created, written, prev, err = s.storeObject(ctx, c, k, org, name, raw, cond, createOnly)
		return err
	})
	version := written.version
	if err != nil {
		return err
	}
	if err := s.applyOrUndo(ctx, org, func() (undo error) {
		switch {
		case raw == nil:
			_, _, undo = k.put(s.store, ctx, c.actor, org, name, prev, 0)
		case created:
			undo = k.del(s.store, ctx, c.actor, org, name, version)
		default:
			_, _, undo = k.put(s.store, ctx, c.actor, org, name, prev, version)
		}
		return undo
	}); err != nil {
		return err
	}
	action := "replace"
	switch {
	case raw == nil:
		action = "delete"
	case created:
		action = "create"
	}
	s.log.Info("control plane change", "actor", c.actor, "action", action, "object", k.object, "org", org, "name", name, "version", version)
	if raw == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	// The object as this write made it: another gateway may have replaced it since.
	o := written
	v, err := objectView(k, org, o)
	if err != nil {
		return err
	}
	w.Header().Set("ETag", etag(o.version))
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/api/v1/orgs/"+url.PathEscape(org)+"/"+k.plural+"/"+url.PathEscape(name))
	}
	writeJSON(w, status, v)
	return nil
}

// storeObject checks a change of org's object name against the store as it is and the live file config,
// and writes it onto exactly that state (Store.At): ErrStale when another gateway wrote meanwhile, and the
// caller checks again. It returns whether the object was created, the object as written (for a delete: the
// version deleted) and its config before. s.mu is held.
func (s *Server) storeObject(ctx context.Context, c *caller, k *objectKind, org, name string, raw []byte, cond precondition, create bool) (created bool, written storedObject, prev []byte, err error) {
	st, err := s.store.Load(ctx)
	if err != nil {
		return false, storedObject{}, nil, err
	}
	if !slices.ContainsFunc(st.Orgs, func(o store.Org) bool { return o.ID == org }) {
		return false, storedObject{}, nil, errOrgNotFound(org)
	}
	file := s.file()
	what := fmt.Sprintf("%s %q", k.object, name)
	if k == routeKind && slices.ContainsFunc(file.Routes, func(rc config.RouteConfig) bool { return rc.Model == name }) {
		return false, storedObject{}, nil, errorf(http.StatusConflict, "conflict", "model %q is routed by rolter.toml: the public model names are one namespace", name)
	}
	owner, prev, version, exists := k.find(st, org, name)
	switch {
	case exists && owner != org:
		// As the store says it: that the model is taken, not by whom.
		return false, storedObject{}, nil, errorf(http.StatusConflict, "conflict", "model %q is used by another org", name)
	case raw == nil && !exists && cond == precondition{}:
		return false, storedObject{}, nil, errorf(http.StatusNotFound, "not_found", "org %q has no %s", org, what)
	case create && exists:
		return false, storedObject{}, nil, errorf(http.StatusConflict, "conflict", "%s exists (version %d): replace it with PUT", what, version)
	}
	if err := cond.check(what, exists, version); err != nil {
		return false, storedObject{}, nil, err
	}
	next := k.with(st, org, name, raw)
	if err := checkQuotas(file.Control.Quotas, k, next, org, name, exists); err != nil {
		return false, storedObject{}, nil, err
	}
	if err := s.checkChange(file, st, next, k.plural, org, name); err != nil {
		return false, storedObject{}, nil, err
	}
	// Written onto the state just checked: a write of another gateway since is ErrStale, and the change is
	// checked again on the state it made. So a PUT without If-Match replaces whatever was stored last (the
	// later PUT wins whole), and one with If-Match conflicts as soon as the version moved.
	at := s.store.At(st.Generation)
	if raw == nil {
		return false, storedObject{name: name, version: version}, prev, k.del(at, ctx, c.actor, org, name, version)
	}
	expect := version
	if create {
		expect = store.CreateOnly
	}
	written, err = k.write(at, ctx, c.actor, org, name, raw, expect)
	return written.version == 1, written, prev, err
}

// staleTries bounds how often a change is checked again because other gateways kept writing meanwhile.
const staleTries = 8

// retryStale runs write until the store does not refuse it as stale, at most staleTries times.
func retryStale(write func() error) error {
	for try := 1; ; try++ {
		err := write()
		if !errors.Is(err, store.ErrStale) {
			return err
		}
		if try == staleTries {
			return errorf(http.StatusConflict, "conflict", "the store kept changing while the change was checked (%d tries): send it again", try)
		}
	}
}

// applyOrUndo applies a change just written to the store. When the gateway refuses it, undo takes it back
// out of the store and the answer is 422 (applyFailed); when the store became unreachable, 503.
func (s *Server) applyOrUndo(ctx context.Context, org string, undo func() error) error {
	err := s.applyLocked(ctx)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrUnavailable):
		return errStoredUnapplied(err)
	}
	return s.applyFailed(org, err, undo())
}

// applyFailed is the answer to a change the gateway refused to apply (422). undo is the error of taking it
// back out of the store.
func (s *Server) applyFailed(org string, err, undo error) error {
	reason := orgMessage(err.Error(), org)
	s.log.Error("a control plane change was refused by the gateway", "org", org, "error", err.Error())
	if undo != nil {
		s.log.Error("cannot take a refused change back out of the store", "org", org, "error", undo.Error())
		return errorf(http.StatusUnprocessableEntity, "apply_failed", "the gateway refused the change: %s; and it could not be taken back out of the store (%s): the store now differs from what serves", reason, undo)
	}
	return errorf(http.StatusUnprocessableEntity, "apply_failed", "the gateway refused the change: %s; the store was put back and the running config keeps serving", reason)
}

// checkChange validates next, the store state st with one change applied, composed with the file config
// as the gateway will run it. Problems of the object written (kind, org, name) are its fields (400);
// problems of other objects that st did not have are what the change breaks (409). Problems st has already
// are not the change's doing and do not refuse it.
func (s *Server) checkChange(file *config.Config, st, next *store.State, kind, org, name string) error {
	_, before, _, err := problems(file, st, kind, org, name)
	if err != nil {
		return err
	}
	own, after, quota, err := problems(file, next, kind, org, name)
	if err != nil {
		return err
	}
	if len(own) > 0 {
		msgs := make([]string, len(own))
		for i, f := range own {
			msgs[i] = f.Field + ": " + f.Message
		}
		e := errorf(http.StatusBadRequest, "invalid_config", "%s", strings.Join(msgs, "; "))
		if quota {
			e = errorf(http.StatusForbidden, "quota_exceeded", "%s", strings.Join(msgs, "; "))
		}
		e.fields = own
		return e
	}
	var caused []string
	for _, p := range after {
		if !slices.Contains(before, p) {
			caused = append(caused, p)
		}
	}
	if len(caused) > 0 {
		e := errorf(http.StatusConflict, "conflict", "the change would break other objects: %s", strings.Join(caused, "; "))
		e.problems = caused
		return e
	}
	return nil
}

// problems composes st with file, validates it, and splits the problems into those of the object (kind,
// org, name) and the others; quota says some of the object's are quotas exceeded.
func problems(file *config.Config, st *store.State, kind, org, name string) (own []FieldError, other []string, quota bool, _ error) {
	cfg, o, err := Compose(file, st)
	if err != nil {
		return nil, nil, false, err
	}
	errs := config.Validate(cfg)
	own, other = FieldErrors(errs, o, kind, org, name)
	var quotas config.Errors
	for _, e := range errs {
		if e.Quota {
			quotas = append(quotas, e)
		}
	}
	ownQuotas, _ := FieldErrors(quotas, o, kind, org, name)
	return own, other, len(ownQuotas) > 0, nil
}

// errQuota is the answer to a write that would take an org over one of its quotas ([control.quotas]).
func errQuota(format string, args ...any) *apiError {
	return errorf(http.StatusForbidden, "quota_exceeded", format+"; the operator sets the quotas in rolter.toml's [control.quotas]", args...)
}

// checkQuotas checks the counts of [control.quotas] on next, the store with org's object name written:
// a new provider or route must fit the org's count, and a route's targets the per-route and the org's
// total. An object that exists may be replaced or deleted whatever the counts, so that an org over a
// quota the operator lowered can still shrink. The routing memory quota is the validator's
// (config.Validate), as it counts the file's routes too.
func checkQuotas(q config.QuotaConfig, k *objectKind, next *store.State, org, name string, exists bool) error {
	switch k {
	case providerKind:
		n := 0
		for _, p := range next.Providers {
			if p.OrgID == org {
				n++
			}
		}
		if !exists && n > q.Providers {
			return errQuota("org %q has %d providers, its quota", org, q.Providers)
		}
	case routeKind:
		n, targets, own := 0, 0, 0
		for _, r := range next.Routes {
			if r.OrgID != org {
				continue
			}
			n++
			var rc config.RouteConfig
			if decodeStrict(r.Config, &rc) != nil {
				continue // the validator says why
			}
			targets += len(rc.Targets)
			if r.Model == name {
				own = len(rc.Targets)
			}
		}
		switch {
		case !exists && n > q.Routes:
			return errQuota("org %q has %d routes, its quota", org, q.Routes)
		case own > q.TargetsPerRoute:
			return errQuota("route %q has %d targets, over the quota of %d per route", name, own, q.TargetsPerRoute)
		case own > 0 && targets > q.Targets:
			return errQuota("the routes of org %q would have %d targets, over its quota of %d", org, targets, q.Targets)
		}
	}
	return nil
}
