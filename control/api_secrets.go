package control

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
)

// secretView is an org secret as the API shows it (openapi.json's Secret): never its value.
type secretView struct {
	Org     string `json:"org"`
	Name    string `json:"name"`
	Created string `json:"created"`
	Updated string `json:"updated"`
}

func viewSecret(sc store.Secret) secretView {
	return secretView{Org: sc.OrgID, Name: sc.Name, Created: timestamp(sc.Created), Updated: timestamp(sc.Updated)}
}

// secretBody is the body of PUT .../secrets/{name}.
type secretBody struct {
	Value string `json:"value"`
}

// errSecretsOff answers a secret write on a control plane without a secrets key.
var errSecretsOff = errorf(http.StatusConflict, "secrets_disabled", "%s", store.ErrNoSecretsKey)

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, c *caller) error {
	return listOrgObjects(w, r, s.store.ListSecrets, viewSecret)
}

// decodeSecret reads the value of a PUT .../secrets/{name}: one a header can carry (the providers send it
// in one), never echoed in an error.
func decodeSecret(w http.ResponseWriter, r *http.Request) (string, error) {
	body, err := readBody(w, r)
	if err != nil {
		return "", err
	}
	var sb secretBody
	if err := decodeObject(body, &sb, "org", "name", "created", "updated"); err != nil {
		return "", err
	}
	if len(sb.Value) > store.MaxSecretLen || !config.HeaderSafe(sb.Value) {
		return "", fieldError("value", fmt.Sprintf("want 1 to %d bytes without control characters or whitespace at either end (it is sent in a header)", store.MaxSecretLen))
	}
	return sb.Value, nil
}

// putSecret sets an org's secret and applies it: the providers naming it send the new value from the next
// request on. The value is stored encrypted and never shown again, nor logged, nor in the audit log.
func (s *Server) putSecret(w http.ResponseWriter, r *http.Request, c *caller) error {
	org, name := r.PathValue("org"), r.PathValue("name")
	if org == fileOrg {
		return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
	}
	if !s.store.HasSecretsKey() {
		return errSecretsOff
	}
	if err := store.CheckSecretName(name); err != nil {
		return fieldError("name", strings.TrimPrefix(err.Error(), store.ErrInvalid.Error()+": "))
	}
	value, err := decodeSecret(w, r)
	if err != nil {
		return err
	}
	return s.writeSecret(w, r, c, org, name, &value)
}

// deleteSecret deletes an org's secret; refused (409) while a provider names it.
func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, c *caller) error {
	org, name := r.PathValue("org"), r.PathValue("name")
	if org == fileOrg {
		return errorf(http.StatusConflict, "conflict", "%s", readOnlyFile)
	}
	return s.writeSecret(w, r, c, org, name, nil)
}

// writeSecret sets (value != nil) or deletes org's secret name as writeObject writes objects: checked
// against the store and the file config, written onto the state checked, applied, and taken back if the
// gateway refuses it.
func (s *Server) writeSecret(w http.ResponseWriter, r *http.Request, c *caller, org, name string, value *string) error {
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	defer s.mu.Unlock()
	var prev *string
	var created bool
	err := retryStale(func() error {
		st, err := s.store.Load(ctx)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(st.Orgs, func(o store.Org) bool { return o.ID == org }) {
			return errOrgNotFound(org)
		}
		prev = nil
		next := *st
		next.Secrets = slices.DeleteFunc(slices.Clone(st.Secrets), func(sv store.SecretValue) bool {
			if sv.OrgID == org && sv.Name == name {
				v := sv.Value
				prev = &v
				return true
			}
			return false
		})
		if value == nil && prev == nil {
			return errorf(http.StatusNotFound, "not_found", "org %q has no secret %q", org, name)
		}
		if value != nil {
			next.Secrets = append(next.Secrets, store.SecretValue{OrgID: org, Name: name, Value: *value})
		}
		if err := s.checkChange(s.file(), st, &next, "secrets", org, name); err != nil {
			return err
		}
		at := s.store.At(st.Generation)
		if value == nil {
			return at.DeleteSecret(ctx, c.actor, org, name)
		}
		created, err = at.PutSecret(ctx, c.actor, org, name, *value)
		return err
	})
	if err != nil {
		return err
	}
	if err := s.applyOrUndo(ctx, org, func() error {
		if prev == nil {
			return s.store.DeleteSecret(ctx, c.actor, org, name)
		}
		_, err := s.store.PutSecret(ctx, c.actor, org, name, *prev)
		return err
	}); err != nil {
		return err
	}
	action := "replace"
	switch {
	case value == nil:
		action = "delete"
	case created:
		action = "create"
	}
	// The name only: a secret's value is never logged.
	s.log.Info("control plane change", "actor", c.actor, "action", action, "object", "secret", "org", org, "name", name)
	if value == nil {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	scs, err := s.store.ListSecrets(ctx, org)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(scs, func(sc store.Secret) bool { return sc.Name == name })
	if i < 0 {
		return errorf(http.StatusConflict, "conflict", "secret %q was deleted meanwhile", name)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/api/v1/orgs/"+url.PathEscape(org)+"/secrets/"+url.PathEscape(name))
	}
	writeJSON(w, status, viewSecret(scs[i]))
	return nil
}
