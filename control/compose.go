package control

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
)

// Origin says where a provider or route of a composed config comes from: the file (Org "") or an org of
// the store.
type Origin struct {
	Org  string // org id, "" for the file
	Name string // provider name or route model, as the API knows it
}

// Origins map the providers and routes of a composed config, by index, to where they come from, so a
// validation problem ("providers[5].api_base") can be told to the API caller as a field of the object it
// wrote.
type Origins struct {
	Providers []Origin
	Routes    []Origin
	// Suspended are the org routes left out because rolter.toml routes their model: the file wins, so
	// that an operator's reload never fails on a name an org took first.
	Suspended []Origin
}

// engineName is the name an org's provider has in the gateway's config: orgs never collide.
func engineName(org, name string) string { return org + "/" + name }

// Compose returns the gateway's config: the file's, plus every org's providers, routes, data-plane keys
// and limits from the store state st, each org provider with the values of the org secrets it names. An org's route
// whose model rolter.toml routes too (the operator added it later) is set aside, not served
// (Origins.Suspended), and comes back when the file drops the model. An org route's target names a provider of its own org, or else one of the
// file's (shared engines). Objects are decoded strictly (unknown fields are errors). The result is not
// validated: config.Validate does that, one path for the file and the API alike.
func Compose(file *config.Config, st *store.State) (*config.Config, *Origins, error) {
	// Validation sets defaults in place: everything it can write is copied, so the file's config (read by
	// whoever holds it) is never written.
	cfg := *file
	cfg.Providers = nil
	for _, p := range file.Providers {
		cfg.Providers = append(cfg.Providers, copyProvider(p))
	}
	cfg.Routes = nil
	for _, r := range file.Routes {
		cfg.Routes = append(cfg.Routes, copyRoute(r))
	}
	cfg.Keys = nil
	o := &Origins{}
	for _, p := range file.Providers {
		o.Providers = append(o.Providers, Origin{Name: p.Name})
	}
	fileModels := make(map[string]bool, len(file.Routes))
	for _, r := range file.Routes {
		o.Routes = append(o.Routes, Origin{Name: r.Model})
		fileModels[r.Model] = true
	}
	orgProviders := map[string]map[string]bool{}
	secrets := map[[2]string]string{}
	for _, sv := range st.Secrets {
		secrets[[2]string{sv.OrgID, sv.Name}] = sv.Value
	}
	for _, sp := range st.Providers {
		var pc config.ProviderConfig
		if err := decodeStrict(sp.Config, &pc); err != nil {
			return nil, nil, fmt.Errorf("cannot decode provider %q of org %q from the store: %w", sp.Name, sp.OrgID, err)
		}
		pc.Name, pc.Org = engineName(sp.OrgID, sp.Name), sp.OrgID
		pc.Secrets = providerSecrets(&pc, secrets)
		cfg.Providers = append(cfg.Providers, pc)
		o.Providers = append(o.Providers, Origin{Org: sp.OrgID, Name: sp.Name})
		if orgProviders[sp.OrgID] == nil {
			orgProviders[sp.OrgID] = map[string]bool{}
		}
		orgProviders[sp.OrgID][sp.Name] = true
	}
	for _, sr := range st.Routes {
		if fileModels[sr.Model] {
			o.Suspended = append(o.Suspended, Origin{Org: sr.OrgID, Name: sr.Model})
			continue
		}
		var rc config.RouteConfig
		if err := decodeStrict(sr.Config, &rc); err != nil {
			return nil, nil, fmt.Errorf("cannot decode route %q of org %q from the store: %w", sr.Model, sr.OrgID, err)
		}
		rc.Model, rc.Org = sr.Model, sr.OrgID
		rc.Targets = append([]config.TargetConfig(nil), rc.Targets...)
		for i := range rc.Targets {
			if orgProviders[sr.OrgID][rc.Targets[i].Provider] {
				rc.Targets[i].Provider = engineName(sr.OrgID, rc.Targets[i].Provider)
			}
		}
		cfg.Routes = append(cfg.Routes, rc)
		o.Routes = append(o.Routes, Origin{Org: sr.OrgID, Name: sr.Model})
	}
	cfg.KeyPepper = st.Pepper
	for _, k := range st.Keys {
		cfg.Keys = append(cfg.Keys, config.DataKey{Org: k.OrgID, Hash: k.Hash, ID: k.ID, Limits: copyLimits(k.Limits)})
	}
	cfg.OrgLimits = nil
	for _, ol := range st.OrgLimits {
		if cfg.OrgLimits == nil {
			cfg.OrgLimits = make(map[string]config.OrgLimits, len(st.OrgLimits))
		}
		cfg.OrgLimits[ol.OrgID] = config.OrgLimits{Org: copyLimits(ol.Org), Keys: copyLimits(ol.Keys)}
	}
	return &cfg, o, nil
}

// providerSecrets returns the values of the secrets of its own org that pc names (api_key_secret,
// header_secrets), by name; a name the org has no secret of is absent (the validator says so). A provider
// gets only what it names, and only from its org.
func providerSecrets(pc *config.ProviderConfig, secrets map[[2]string]string) map[string]string {
	names := make([]string, 0, 1+len(pc.HeaderSecrets))
	if pc.APIKeySecret != "" {
		names = append(names, pc.APIKeySecret)
	}
	for _, name := range pc.HeaderSecrets {
		names = append(names, name)
	}
	if len(names) == 0 {
		return nil
	}
	out := make(map[string]string, len(names))
	for _, name := range names {
		if v, ok := secrets[[2]string{pc.Org, name}]; ok {
			out[name] = v
		}
	}
	return out
}

// copyProvider copies p deeply enough that setting its defaults does not write into p.
func copyProvider(p config.ProviderConfig) config.ProviderConfig {
	if p.KVEvents != nil {
		kv := *p.KVEvents
		p.KVEvents = &kv
	}
	if p.LMCache != nil {
		lc := *p.LMCache
		p.LMCache = &lc
	}
	if p.Headers != nil {
		h := make(map[string]string, len(p.Headers))
		for k, v := range p.Headers {
			h[k] = v
		}
		p.Headers = h
	}
	return p
}

// copyLimits copies l (nil: none) so that the config shares nothing with the store's state.
func copyLimits(l *config.Limits) *config.Limits {
	if l == nil {
		return nil
	}
	c := *l
	c.Models = maps.Clone(l.Models)
	return &c
}

// copyRoute copies r deeply enough that setting its defaults does not write into r.
func copyRoute(r config.RouteConfig) config.RouteConfig {
	r.Targets = append([]config.TargetConfig(nil), r.Targets...)
	if r.LoRA != nil {
		l := *r.LoRA
		l.Adapters = append([]string(nil), l.Adapters...)
		r.LoRA = &l
	}
	return r
}

// decodeStrict decodes JSON refusing unknown fields and trailing data, as the TOML loader refuses unknown
// keys.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("unexpected data after the JSON object")
	}
	return nil
}

// FieldError is one problem of an object written through the API, at its JSON field path.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// FieldErrors turns the problems of a composed config into the field errors of one API object: the
// provider or route (kind "providers" or "routes") of org named name. Problems of other objects are
// returned apart (they mean the change breaks something else, e.g. a route that names a provider being
// deleted).
func FieldErrors(errs config.Errors, o *Origins, kind, org, name string) (own []FieldError, other []string) {
	for _, e := range errs {
		idx, rest, ok := indexOf(e.Key, kind)
		if ok {
			var origin Origin
			switch kind {
			case "providers":
				if idx < len(o.Providers) {
					origin = o.Providers[idx]
				}
			case "routes":
				if idx < len(o.Routes) {
					origin = o.Routes[idx]
				}
			}
			if origin.Org == org && origin.Name == name {
				field := strings.TrimPrefix(rest, ".")
				own = append(own, FieldError{Field: field, Message: orgMessage(e.Msg, org)})
				continue
			}
		}
		other = append(other, describe(e, o))
	}
	return own, other
}

// indexOf parses "providers[3].kv_events.endpoint" into 3 and ".kv_events.endpoint" when the key is of kind.
func indexOf(key, kind string) (int, string, bool) {
	rest, ok := strings.CutPrefix(key, kind+"[")
	if !ok {
		return 0, "", false
	}
	end := strings.IndexByte(rest, ']')
	if end < 0 {
		return 0, "", false
	}
	i, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0, "", false
	}
	return i, rest[end+1:], true
}

// describe names where a problem is, in the API's terms.
func describe(e *config.Error, o *Origins) string {
	for _, kind := range []string{"providers", "routes"} {
		if i, rest, ok := indexOf(e.Key, kind); ok {
			var origin Origin
			if kind == "providers" && i < len(o.Providers) {
				origin = o.Providers[i]
			} else if kind == "routes" && i < len(o.Routes) {
				origin = o.Routes[i]
			}
			where := "rolter.toml"
			if origin.Org != "" {
				where = "org " + origin.Org
			}
			return fmt.Sprintf("%s %s %q%s: %s", where, strings.TrimSuffix(kind, "s"), origin.Name, rest, orgMessage(e.Msg, origin.Org))
		}
	}
	return e.Error()
}

// orgMessage takes the engine's "<org>/" prefix off provider names in a message.
func orgMessage(msg, org string) string {
	if org == "" {
		return msg
	}
	return strings.ReplaceAll(msg, org+"/", "")
}
