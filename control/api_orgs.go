package control

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/engine"
)

// orgView is an org as the API shows it (openapi.json's Org).
type orgView struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Created  string `json:"created,omitempty"` // absent for "file"
	ReadOnly bool   `json:"read_only"`
}

// fileOrgView is the org of rolter.toml's providers and routes.
var fileOrgView = orgView{ID: fileOrg, Name: "rolter.toml", ReadOnly: true}

func viewOrg(o store.Org) orgView {
	return orgView{ID: o.ID, Name: o.Name, Created: timestamp(o.Created)}
}

// listOrgs shows the superadmin every org, "file" first; an org token sees its own org only.
func (s *Server) listOrgs(w http.ResponseWriter, r *http.Request, c *caller) error {
	if !c.super {
		o, err := s.store.GetOrg(r.Context(), c.org)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, listOf([]orgView{viewOrg(o)}))
		return nil
	}
	orgs, err := s.store.ListOrgs(r.Context())
	if err != nil {
		return err
	}
	out := []orgView{fileOrgView}
	for _, o := range orgs {
		out = append(out, viewOrg(o))
	}
	writeJSON(w, http.StatusOK, listOf(out))
	return nil
}

// orgExists is nil for an org of the store, else the API's 404.
func (s *Server) orgExists(ctx context.Context, org string) error {
	_, err := s.store.GetOrg(ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		return errOrgNotFound(org)
	}
	return err
}

func (s *Server) getOrg(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org == fileOrg {
		writeJSON(w, http.StatusOK, fileOrgView)
		return nil
	}
	o, err := s.store.GetOrg(r.Context(), org)
	if errors.Is(err, store.ErrNotFound) {
		return errOrgNotFound(org)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOrg(o))
	return nil
}

// nameBody is the body of POST /orgs, .../keys and .../tokens.
type nameBody struct {
	Name string `json:"name"`
}

func decodeName(w http.ResponseWriter, r *http.Request, what string) (string, error) {
	body, err := readBody(w, r)
	if err != nil {
		return "", err
	}
	var nb nameBody
	if err := decodeObject(body, &nb, "id", "created"); err != nil {
		return "", err
	}
	return nb.Name, checkNameField(what, nb.Name)
}

// checkNameField is the API's 400 for a name the store cannot keep.
func checkNameField(what, name string) error {
	if err := store.CheckName(what+" name", name, store.MaxNameLen); err != nil {
		return fieldError("name", strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
	return nil
}

// createOrg makes an org. An empty org adds nothing to the gateway's config, so there is nothing to apply.
func (s *Server) createOrg(w http.ResponseWriter, r *http.Request, c *caller) error {
	name, err := decodeName(w, r, "org")
	if err != nil {
		return err
	}
	o, err := s.store.CreateOrg(context.WithoutCancel(r.Context()), c.actor, name)
	if err != nil {
		return err
	}
	s.log.Info("control plane change", "actor", c.actor, "action", "create", "object", "org", "org", o.ID, "name", name)
	w.Header().Set("Location", "/api/v1/orgs/"+url.PathEscape(o.ID))
	writeJSON(w, http.StatusCreated, viewOrg(o))
	return nil
}

// deleteOrg deletes an org with everything it has, and applies that: its routes stop serving and its keys
// stop working before the answer. The store cannot put a deleted org back, so a gateway that refuses the
// change (422) keeps serving the org until a reload succeeds.
func (s *Server) deleteOrg(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org == fileOrg {
		return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
	}
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	err := retryStale(func() error {
		st, err := s.store.Load(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(st.Orgs, func(o store.Org) bool { return o.ID == org }) {
			return errOrgNotFound(org)
		}
		next := *st
		gone := func(id string) bool { return id == org }
		next.Providers = slices.DeleteFunc(slices.Clone(st.Providers), func(p store.Provider) bool { return gone(p.OrgID) })
		next.Routes = slices.DeleteFunc(slices.Clone(st.Routes), func(r store.Route) bool { return gone(r.OrgID) })
		next.Keys = slices.DeleteFunc(slices.Clone(st.Keys), func(k store.KeyHash) bool { return gone(k.OrgID) })
		next.OrgLimits = slices.DeleteFunc(slices.Clone(st.OrgLimits), func(ol store.OrgLimits) bool { return gone(ol.OrgID) })
		if err := s.checkChange(s.file(), st, &next, "orgs", org, ""); err != nil {
			return err
		}
		return s.store.At(st.Generation).DeleteOrg(ctx, c.actor, org) // onto the state checked (storeObject)
	})
	if err != nil {
		return err
	}
	if err := s.applyLocked(ctx); err != nil {
		if errors.Is(err, store.ErrUnavailable) {
			return errStoredUnapplied(err)
		}
		s.log.Error("an org was deleted from the store but the gateway refused the change; it serves the org until a reload succeeds", "org", org, "error", err.Error())
		return errorf(http.StatusUnprocessableEntity, "apply_failed", "org %q is deleted from the store, but the gateway refused the change: %s; it keeps serving the org's routes and keys until a reload succeeds", org, orgMessage(err.Error(), org))
	}
	s.log.Info("control plane change", "actor", c.actor, "action", "delete", "object", "org", "org", org)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// credentialKind is what data-plane keys and org admin tokens share.
type credentialKind struct {
	object string // "key", "token"
	prefix string // of the secret: "rk-", "rt-"
	// apply: the gateway's config holds the credential (keys), so a change is applied; tokens are the
	// control plane's own and checked against the store on every request.
	apply bool
	// limits: the credential has limits of its own (keys), taken at creation and shown with it.
	limits bool
	// create records a credential; limits are nil for a token.
	create func(s *store.Store, ctx context.Context, actor, org, name string, hash [32]byte, prefix string, limits *config.Limits) (store.Credential, error)
	list   func(s *store.Store, ctx context.Context, org string) ([]store.Credential, error)
	revoke func(s *store.Store, ctx context.Context, actor, org, id string) error
}

var (
	keyCredentials = &credentialKind{object: "key", prefix: "rk-", apply: true, limits: true,
		create: (*store.Store).CreateKey, list: (*store.Store).ListKeys, revoke: (*store.Store).RevokeKey}
	tokenCredentials = &credentialKind{object: "token", prefix: "rt-",
		create: func(s *store.Store, ctx context.Context, actor, org, name string, hash [32]byte, prefix string, _ *config.Limits) (store.Credential, error) {
			return s.CreateToken(ctx, actor, org, name, hash, prefix)
		},
		list: (*store.Store).ListTokens, revoke: (*store.Store).RevokeToken}
)

// credentialView is a key or token as listed: never its secret, nor its hash.
type credentialView struct {
	ID      string `json:"id"`
	Org     string `json:"org"`
	Name    string `json:"name"`
	Prefix  string `json:"prefix"`
	Created string `json:"created"`
	Revoked string `json:"revoked,omitempty"`
}

func viewCredential(cr store.Credential) credentialView {
	v := credentialView{ID: cr.ID, Org: cr.OrgID, Name: cr.Name, Prefix: cr.Prefix, Created: timestamp(cr.Created)}
	if !cr.Revoked.IsZero() {
		v.Revoked = timestamp(cr.Revoked)
	}
	return v
}

// keyView is a data-plane key as listed (openapi.json's Key): a credential with its own limits, null for
// none (its org's key default applies).
type keyView struct {
	credentialView
	Limits *config.Limits `json:"limits"`
}

func viewKey(cr store.Credential) keyView {
	return keyView{viewCredential(cr), cr.Limits}
}

// view is cr as k's answers show it: a keyView for a key, a credentialView for a token.
func (k *credentialKind) view(cr store.Credential) any {
	if k.limits {
		return viewKey(cr)
	}
	return viewCredential(cr)
}

// secretPrefixLen is how much of a secret the store keeps for display.
const secretPrefixLen = 8

// newSecret returns a new secret: prefix and 32 random bytes, base64url without padding.
func newSecret(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("BUG: crypto/rand failed: " + err.Error()) // rand.Read never fails since Go 1.24
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func (s *Server) listCredentials(k *credentialKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		list := func(ctx context.Context, org string) ([]store.Credential, error) { return k.list(s.store, ctx, org) }
		return listOrgObjects(w, r, list, k.view)
	}
}

// listOrgObjects answers the list of the {org} path value's objects, each as view shows it. The file's
// org has none of them.
func listOrgObjects[T, V any](w http.ResponseWriter, r *http.Request, list func(context.Context, string) ([]T, error), view func(T) V) error {
	org := r.PathValue("org")
	if org == fileOrg {
		writeJSON(w, http.StatusOK, listOf([]V(nil)))
		return nil
	}
	items, err := list(r.Context(), org)
	if errors.Is(err, store.ErrNotFound) {
		return errOrgNotFound(org)
	}
	if err != nil {
		return err
	}
	out := make([]V, len(items))
	for i, it := range items {
		out[i] = view(it)
	}
	writeJSON(w, http.StatusOK, listOf(out))
	return nil
}

// createCredential makes a key or token and answers its secret, the only time it is shown: the store
// keeps its keyed hash and its first characters. A key is applied before the answer, so it works at once.
func (s *Server) createCredential(k *credentialKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org := r.PathValue("org")
		if org == fileOrg {
			return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
		}
		var name string
		var limits *config.Limits
		var err error
		if k.limits {
			name, limits, err = decodeKey(w, r)
		} else {
			name, err = decodeName(w, r, k.object)
		}
		if err != nil {
			return err
		}
		secret := newSecret(k.prefix)
		ctx := context.WithoutCancel(r.Context())
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.checkCredentialQuota(ctx, k, org); err != nil {
			return err
		}
		cr, err := k.create(s.store, ctx, c.actor, org, name, s.secretHash(secret), secret[:secretPrefixLen], limits)
		if errors.Is(err, store.ErrNotFound) {
			return errOrgNotFound(org)
		}
		if err != nil {
			return err
		}
		if k.apply {
			if err := s.applyLocked(ctx); err != nil {
				if errors.Is(err, store.ErrUnavailable) {
					return errorf(http.StatusServiceUnavailable, "store_unavailable",
						"%s %q is stored, but the store became unreachable before this gateway loaded it, so its secret is not shown: revoke it when the store is back and create another (%s)", k.object, cr.ID, err)
				}
				return s.applyFailed(org, err, k.revoke(s.store, ctx, c.actor, org, cr.ID))
			}
		}
		s.log.Info("control plane change", "actor", c.actor, "action", "create", "object", k.object, "org", org, "name", cr.ID)
		if k.limits {
			writeJSON(w, http.StatusCreated, struct {
				keyView
				Secret string `json:"secret"`
			}{viewKey(cr), secret})
			return nil
		}
		writeJSON(w, http.StatusCreated, struct {
			credentialView
			Secret string `json:"secret"`
		}{viewCredential(cr), secret})
		return nil
	}
}

// checkCredentialQuota refuses a new key or token of an org that has its quota of them (not revoked).
// s.mu is held: two writes of this gateway cannot both pass on the same count.
func (s *Server) checkCredentialQuota(ctx context.Context, k *credentialKind, org string) error {
	q := s.file().Control.Quotas
	limit := q.Keys
	if k == tokenCredentials {
		limit = q.Tokens
	}
	crs, err := k.list(s.store, ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		return errOrgNotFound(org)
	}
	if err != nil {
		return err
	}
	n := 0
	for _, cr := range crs {
		if cr.Revoked.IsZero() {
			n++
		}
	}
	if n >= limit {
		return errQuota("org %q has %d %ss that are not revoked, its quota: revoke one first", org, n, k.object)
	}
	return nil
}

// revokeCredential revokes a key or token. A revoked key stops working before the answer. A revocation is
// never taken back: if the gateway refuses the change (422), the key stays revoked in the store and the
// gateway takes it at its next successful reload.
func (s *Server) revokeCredential(k *credentialKind) func(http.ResponseWriter, *http.Request, *caller) error {
	return func(w http.ResponseWriter, r *http.Request, c *caller) error {
		org, id := r.PathValue("org"), r.PathValue("id")
		if org == fileOrg {
			return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
		}
		ctx := context.WithoutCancel(r.Context())
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := k.revoke(s.store, ctx, c.actor, org, id); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				if err := s.orgExists(ctx, org); err != nil {
					return err
				}
				return errorf(http.StatusNotFound, "not_found", "org %q has no %s %q", org, k.object, id)
			}
			return err
		}
		if k.apply {
			if err := s.applyLocked(ctx); err != nil {
				if errors.Is(err, store.ErrUnavailable) {
					return errStoredUnapplied(err)
				}
				s.log.Error("a key was revoked in the store but the gateway refused the change; it accepts the key until a reload succeeds", "org", org, "key", id, "error", err.Error())
				return errorf(http.StatusUnprocessableEntity, "apply_failed", "key %q is revoked in the store, but the gateway refused the change: %s; it accepts the key until a reload succeeds", id, orgMessage(err.Error(), org))
			}
		}
		s.log.Info("control plane change", "actor", c.actor, "action", "revoke", "object", k.object, "org", org, "name", id)
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
}

// auditView is an audit log entry (openapi.json's AuditEntry).
type auditView struct {
	ID         int64  `json:"id"`
	At         string `json:"at"`
	Generation int64  `json:"generation"`
	Actor      string `json:"actor"`
	Org        string `json:"org"`
	Action     string `json:"action"`
	Object     string `json:"object"`
	Name       string `json:"name"`
	Detail     string `json:"detail"`
}

// Audit log pages: ?limit=, default and most.
const (
	defaultAuditLimit = 100
	maxAuditLimit     = 1000
)

func auditLimit(r *http.Request) (int, error) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return defaultAuditLimit, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxAuditLimit {
		return 0, errorf(http.StatusBadRequest, "invalid_request", "cannot use limit %q: want an integer from 1 to %d", v, maxAuditLimit)
	}
	return n, nil
}

func (s *Server) writeAudit(w http.ResponseWriter, r *http.Request, org string) error {
	limit, err := auditLimit(r)
	if err != nil {
		return err
	}
	es, err := s.store.Audit(r.Context(), org, limit)
	if err != nil {
		return err
	}
	out := make([]auditView, len(es))
	for i, e := range es {
		out[i] = auditView{e.ID, timestamp(e.At), e.Generation, e.Actor, e.OrgID, e.Action, e.Object, e.Name, e.Detail}
	}
	writeJSON(w, http.StatusOK, listOf(out))
	return nil
}

// getAudit is the whole audit log, newest first; ?org= narrows it to one org, deleted ones included.
func (s *Server) getAudit(w http.ResponseWriter, r *http.Request, c *caller) error {
	return s.writeAudit(w, r, r.URL.Query().Get("org"))
}

// getOrgAudit is the audit log of one existing org, newest first.
func (s *Server) getOrgAudit(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org == fileOrg {
		writeJSON(w, http.StatusOK, listOf([]auditView(nil)))
		return nil
	}
	if err := s.orgExists(r.Context(), org); err != nil {
		return err
	}
	return s.writeAudit(w, r, org)
}

// stateView is GET /api/v1/state (openapi.json's State): the gateway's live state, the store generation
// its config serves, and (for the superadmin) every gateway on the store with the generation it serves.
type stateView struct {
	engine.State
	StoreGeneration int64         `json:"store_generation"`
	Replicas        []replicaView `json:"replicas,omitzero"` // nil for an org token: omitted
	// ReplicasError says why the replicas could not be read (the store is unreachable): the rest of the
	// answer is this gateway's own and stays true.
	ReplicasError string `json:"replicas_error,omitempty"`
	// SuspendedRoutes are the org routes not served because rolter.toml routes their model (Compose).
	SuspendedRoutes []suspendedView `json:"suspended_routes"`
	// Sources are the discovery sources and what each sees (the superadmin's only: they are the operator's).
	Sources []discovery.Status `json:"sources,omitempty"`
}

// suspendedView is an org route set aside (openapi.json's SuspendedRoute).
type suspendedView struct {
	Org    string `json:"org"`
	Model  string `json:"model"`
	Reason string `json:"reason"`
}

// suspendedReason is why an org's route is set aside, in the state and in the route's own view.
const suspendedReason = "rolter.toml routes this model: the file wins, and the route is not served until the file drops it"

// suspended returns the org routes the serving config sets aside (Compose), of org only unless org is ""
// (every org). It reads no store: the state is the gateway's own, answered while the store is down too.
func (s *Server) suspended(org string) []suspendedView {
	out := []suspendedView{}
	if p := s.setAside.Load(); p != nil {
		for _, o := range *p {
			if org == "" || o.Org == org {
				out = append(out, suspendedView{Org: o.Org, Model: o.Name, Reason: suspendedReason})
			}
		}
	}
	return out
}

// replicaView is one gateway on the store (openapi.json's Replica).
type replicaView struct {
	ID         string `json:"id"`
	Address    string `json:"address"`
	Version    string `json:"version"`
	Generation int64  `json:"generation"`
	Error      string `json:"error,omitempty"`
	LastSeen   string `json:"last_seen"`
	Self       bool   `json:"self"`
}

// ownNames returns a copy of an org's route targets with its providers under the names it gave them.
func ownNames(ts []engine.TargetState, org string) []engine.TargetState {
	ts = slices.Clone(ts)
	for i := range ts {
		ts[i].Provider = strings.TrimPrefix(ts[i].Provider, org+"/")
	}
	return ts
}

// getState is the gateway's live state: everything for the superadmin; for an org token, its org's routes
// only, with its providers under the names it gave them, and no replicas (the fleet is the operator's).
func (s *Server) getState(w http.ResponseWriter, r *http.Request, c *caller) error {
	st := s.state()
	if !c.super {
		own := st.Routes[:0:0]
		for _, rs := range st.Routes {
			if rs.Org != c.org {
				continue
			}
			rs.Targets = ownNames(rs.Targets, c.org)
			if pd := rs.Disaggregation; pd != nil {
				own := *pd
				own.Decode = ownNames(pd.Decode, c.org)
				rs.Disaggregation = &own
			}
			own = append(own, rs)
		}
		st.Routes = own
	}
	if st.Routes == nil {
		st.Routes = []engine.RouteState{}
	}
	for i := range st.Routes {
		if st.Routes[i].Decisions == nil {
			st.Routes[i].Decisions = map[string]uint64{}
		}
	}
	v := stateView{State: st, StoreGeneration: s.applied.Load()}
	org := ""
	if !c.super {
		org = c.org
	}
	v.SuspendedRoutes = s.suspended(org)
	if c.super && s.sources != nil {
		v.Sources = s.sources()
	}
	if c.super {
		rs, err := s.store.Replicas(r.Context())
		if err != nil {
			v.ReplicasError = err.Error()
		}
		v.Replicas = []replicaView{}
		for _, rp := range rs {
			v.Replicas = append(v.Replicas, replicaView{ID: rp.ID, Address: rp.Address, Version: rp.Version, Generation: rp.Generation,
				Error: rp.Error, LastSeen: timestamp(rp.Seen), Self: rp.ID == s.replicaID})
		}
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}
