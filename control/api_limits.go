package control

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
)

// The limits of orgs and their data-plane keys. The superadmin sets an org's own limits and the default
// of its keys: an org admin must not raise what caps its org. An org admin sets the own limits of its
// keys, which its org's own limits still cap. Each change is applied before the answer, as every change is.

// orgLimitsView is GET and PUT /api/v1/orgs/{org}/limits (openapi.json's OrgLimits): null for none of the
// org's own, when rolter.toml's [limits] org and key apply.
type orgLimitsView struct {
	Org       string         `json:"org"`
	Limits    *config.Limits `json:"limits"`
	KeyLimits *config.Limits `json:"key_limits"`
}

// orgLimitsBody is the body of PUT /api/v1/orgs/{org}/limits (openapi.json's OrgLimitsInput): a field
// left out is null.
type orgLimitsBody struct {
	Limits    *config.Limits `json:"limits"`
	KeyLimits *config.Limits `json:"key_limits"`
}

// keyLimitsBody is the body of PUT .../keys/{id}/limits (openapi.json's KeyLimitsInput).
type keyLimitsBody struct {
	Limits *config.Limits `json:"limits"`
}

// keyBody is the body of POST .../keys (openapi.json's KeyInput).
type keyBody struct {
	Name   string         `json:"name"`
	Limits *config.Limits `json:"limits"`
}

// errFileLimits answers a limits request for the org of rolter.toml's objects, which has no keys.
func errFileLimits() error {
	return errorf(http.StatusNotFound, "not_found", "org %q is rolter.toml's providers and routes: it has no keys and no limits; rolter.toml's [limits] sets the limits of orgs and keys that have none of their own", fileOrg)
}

// checkLimitsFields is the API's 400 for limits that fail config.Limits.Check, each problem a field
// ("limits.rpm", `key_limits.models."gpt".tpm`); fields are the body's limits by their field name, nil for
// none.
func checkLimitsFields(fields map[string]*config.Limits) error {
	var fes []FieldError
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		l := fields[f]
		if l == nil {
			continue
		}
		for _, msg := range l.Check(f) {
			// Check's messages are "<field>: <problem>", and no problem has ": " in it (a model name may).
			cut := strings.LastIndex(msg, ": ")
			fes = append(fes, FieldError{Field: msg[:cut], Message: msg[cut+2:]})
		}
	}
	if len(fes) == 0 {
		return nil
	}
	msgs := make([]string, len(fes))
	for i, fe := range fes {
		msgs[i] = fe.Field + ": " + fe.Message
	}
	e := errorf(http.StatusBadRequest, "invalid_config", "%s", strings.Join(msgs, "; "))
	e.fields = fes
	return e
}

// decodeKey reads the body of POST .../keys: the key's name and its own limits (nil for none).
func decodeKey(w http.ResponseWriter, r *http.Request) (string, *config.Limits, error) {
	body, err := readBody(w, r)
	if err != nil {
		return "", nil, err
	}
	var kb keyBody
	if err := decodeObject(body, &kb, "id", "created"); err != nil {
		return "", nil, err
	}
	if err := checkNameField("key", kb.Name); err != nil {
		return "", nil, err
	}
	if err := checkLimitsFields(map[string]*config.Limits{"limits": kb.Limits}); err != nil {
		return "", nil, err
	}
	return kb.Name, kb.Limits, nil
}

// getOrgLimits is an org's own limits and its keys' default.
func (s *Server) getOrgLimits(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org == fileOrg {
		return errFileLimits()
	}
	ol, err := s.store.GetOrgLimits(r.Context(), org)
	if errors.Is(err, store.ErrNotFound) {
		return errOrgNotFound(org)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, orgLimitsView{Org: org, Limits: ol.Org, KeyLimits: ol.Keys})
	return nil
}

// putOrgLimits replaces an org's own limits and its keys' default (the superadmin's only), and applies
// them: the gateway enforces them before the answer.
func (s *Server) putOrgLimits(w http.ResponseWriter, r *http.Request, c *caller) error {
	org := r.PathValue("org")
	if org == fileOrg {
		return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
	}
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	var b orgLimitsBody
	if err := decodeObject(body, &b); err != nil {
		return err
	}
	if err := checkLimitsFields(map[string]*config.Limits{"limits": b.Limits, "key_limits": b.KeyLimits}); err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	var prev store.OrgLimits
	err = retryStale(func() error {
		st, err := s.store.Load(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(st.Orgs, func(o store.Org) bool { return o.ID == org }) {
			return errOrgNotFound(org)
		}
		prev = store.OrgLimits{OrgID: org}
		next := *st
		next.OrgLimits = slices.DeleteFunc(slices.Clone(st.OrgLimits), func(ol store.OrgLimits) bool {
			if ol.OrgID == org {
				prev = ol
			}
			return ol.OrgID == org
		})
		next.OrgLimits = append(next.OrgLimits, store.OrgLimits{OrgID: org, Org: b.Limits, Keys: b.KeyLimits})
		if err := s.checkChange(s.file(), st, &next, "orgs", org, ""); err != nil {
			return err
		}
		return s.store.At(st.Generation).SetOrgLimits(ctx, c.actor, org, b.Limits, b.KeyLimits) // onto the state checked
	})
	if err != nil {
		return err
	}
	if err := s.applyOrUndo(ctx, org, func() error {
		return s.store.SetOrgLimits(ctx, c.actor, org, prev.Org, prev.Keys)
	}); err != nil {
		return err
	}
	s.log.Info("control plane change", "actor", c.actor, "action", "replace", "object", "org limits", "org", org)
	writeJSON(w, http.StatusOK, orgLimitsView{Org: org, Limits: b.Limits, KeyLimits: b.KeyLimits})
	return nil
}

// findKey returns the key id of org, revoked or not: 404 when the org or the key does not exist.
func (s *Server) findKey(ctx context.Context, org, id string) (store.Credential, error) {
	ks, err := s.store.ListKeys(ctx, org)
	if errors.Is(err, store.ErrNotFound) {
		return store.Credential{}, errOrgNotFound(org)
	}
	if err != nil {
		return store.Credential{}, err
	}
	i := slices.IndexFunc(ks, func(k store.Credential) bool { return k.ID == id })
	if i < 0 {
		return store.Credential{}, errorf(http.StatusNotFound, "not_found", "org %q has no key %q", org, id)
	}
	return ks[i], nil
}

// getKey is one data-plane key with its limits; never its secret.
func (s *Server) getKey(w http.ResponseWriter, r *http.Request, c *caller) error {
	org, id := r.PathValue("org"), r.PathValue("id")
	if org == fileOrg {
		return errorf(http.StatusNotFound, "not_found", "org %q has no key %q", org, id)
	}
	k, err := s.findKey(r.Context(), org, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewKey(k))
	return nil
}

// putKeyLimits replaces a key's own limits (an org admin may: its org's own limits still cap the key),
// and applies them before the answer. A revoked key's limits cannot change (409).
func (s *Server) putKeyLimits(w http.ResponseWriter, r *http.Request, c *caller) error {
	org, id := r.PathValue("org"), r.PathValue("id")
	if org == fileOrg {
		return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
	}
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	var b keyLimitsBody
	if err := decodeObject(body, &b); err != nil {
		return err
	}
	if err := checkLimitsFields(map[string]*config.Limits{"limits": b.Limits}); err != nil {
		return err
	}
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	var prev *config.Limits
	err = retryStale(func() error {
		st, err := s.store.Load(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(st.Orgs, func(o store.Org) bool { return o.ID == org }) {
			return errOrgNotFound(org)
		}
		i := slices.IndexFunc(st.Keys, func(k store.KeyHash) bool { return k.ID == id && k.OrgID == org })
		if i < 0 { // revoked, or none
			k, err := s.findKey(ctx, org, id)
			if err != nil {
				return err
			}
			if k.Revoked.IsZero() {
				return store.ErrStale // created by another gateway since the state was read
			}
			return errorf(http.StatusConflict, "conflict", "key %q was revoked at %s: its limits cannot change", id, timestamp(k.Revoked))
		}
		prev = st.Keys[i].Limits
		next := *st
		next.Keys = slices.Clone(st.Keys)
		next.Keys[i].Limits = b.Limits
		if err := s.checkChange(s.file(), st, &next, "keys", org, id); err != nil {
			return err
		}
		return s.store.At(st.Generation).SetKeyLimits(ctx, c.actor, org, id, b.Limits) // onto the state checked
	})
	if err != nil {
		return err
	}
	if err := s.applyOrUndo(ctx, org, func() error {
		return s.store.SetKeyLimits(ctx, c.actor, org, id, prev)
	}); err != nil {
		return err
	}
	s.log.Info("control plane change", "actor", c.actor, "action", "replace", "object", "key limits", "org", org, "name", id)
	k, err := s.findKey(ctx, org, id)
	if err != nil {
		return fmt.Errorf("cannot read key %q back: %w", id, err)
	}
	// The limits as this write made them: another gateway may have replaced them since.
	k.Limits = b.Limits
	writeJSON(w, http.StatusOK, viewKey(k))
	return nil
}
