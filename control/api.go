package control

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/rolter-ai/rolter/control/store"

	"github.com/rolter-ai/rolter/config"
	"github.com/rolter-ai/rolter/discovery"
	"github.com/rolter-ai/rolter/docs"
	"github.com/rolter-ai/rolter/engine"
)

// openAPI is the API's OpenAPI 3.0 document, served as is at GET /api/v1/openapi.json. The tests validate
// every response they receive against it (api_test.go).
//
//go:embed openapi.json
var openAPI []byte

// fileOrg is the reserved org id under which the providers and routes of rolter.toml are shown: read-only,
// to the superadmin only. The store's org ids all start with "org_", so none is "file".
const fileOrg = "file"

// readOnlyFile is the answer to any write to an object of rolter.toml.
const readOnlyFile = "defined in rolter.toml: read-only; change the file and send SIGHUP"

// Options configure a Server. Every field but Logger is required; AdminToken may be empty only when Listen
// is a loopback address.
type Options struct {
	Store *store.Store
	// File returns the live file config (valid, with its defaults set, as config.Parse returns it); it
	// changes on SIGHUP, after which the caller calls Reload. The Server never modifies it.
	File func() *config.Config
	// Apply makes a config serve (engine.Gateway.Reload): it returns after the new snapshot serves, or with
	// the reason it refused the config, in which case the running config keeps serving.
	Apply func(*config.Config) error
	// State returns the gateway's live state (engine.Gateway.State).
	State func() engine.State
	// Sources reports the discovery sources (discovery.Fleet.Status); nil without any.
	Sources func() []discovery.Status
	// Metrics writes the gateway's metrics for a scope (engine.Gateway.WriteMetrics); nil: GET
	// /api/v1/metrics answers none.
	Metrics func(w io.Writer, scope string)
	// Usage drains what the data-plane keys used since the last drain (engine.Gateway.DrainUsage):
	// FlushUsage and a UsageFlusher store it. nil: the gateway's usage is not stored.
	Usage func(dst []engine.UsageRow) []engine.UsageRow
	// AdminToken is the superadmin's bearer token. Empty: the control plane runs open (every caller without
	// a token is the superadmin), which is refused unless Listen is a loopback address.
	AdminToken string
	// Listen is the address the control plane's listener binds (its host decides whether open mode is
	// allowed); the Server does not listen itself.
	Listen string
	// Hosts are further names the control plane answers to in the Host header ([control] hosts); its
	// listen address, and localhost on loopback, need not be listed (guard.go).
	Hosts []string
	// Version is the gateway's version, shown by GET /api/v1/info and the dashboard; "" is "dev".
	Version string
	Logger  *slog.Logger
	// Generation is the store generation the gateway's config was composed from when it started (the
	// State.Generation of that Load); 0 when it serves none yet. Sync applies the store once it moves.
	Generation int64
	// ReplicaID names this gateway among the store's replicas (Follower, GET /api/v1/state); "" is
	// "<host name>/<process id>".
	ReplicaID string
}

// Server is the control plane's REST API under /api/v1 (the contract is openapi.json). Every accepted
// change goes through one path: the candidate store state is composed with the file config and validated by config.Validate, written to the store, and applied
// to the gateway; the answer is sent after the gateway serves it, and a change the gateway refuses is
// taken back out of the store.
//
// Server is safe for concurrent use: reads go to the store concurrently, writes and reloads are serialised.
type Server struct {
	store   *store.Store
	file    func() *config.Config
	apply   func(*config.Config) error
	state   func() engine.State
	sources func() []discovery.Status
	metrics func(w io.Writer, scope string)
	log     *slog.Logger

	drainUsage func(dst []engine.UsageRow) []engine.UsageRow
	usage      usageBook // drained and not stored yet (usage.go)

	version   string
	dashboard *dashboard // the embedded web UI at /dashboard/ (dashboard.go)

	admin  [32]byte // SHA-256 of the superadmin token: compared in constant time, whatever its length
	open   bool     // no superadmin token: a caller without a token is the superadmin
	pepper [32]byte // the store's: secrets are hashed as SHA-256(pepper || secret)

	mux       *http.ServeMux
	handler   http.Handler // mux behind the guard
	hosts     *hostSet     // the names the control plane answers to (guard.go)
	endpoints []endpoint

	// mu serialises writes and reloads: a write validates, stores and applies against the state it read,
	// with no other write of this gateway between (and the store refuses to commit it onto another
	// gateway's: Store.At).
	mu sync.Mutex

	replicaID string
	// applied is the store generation the gateway's config serves: set by every successful apply.
	applied atomic.Int64
	// refused is the newest generation Sync could not apply and why (under mu); Sync does not try it again
	// until the store moves on, and any successful apply clears it.
	refused    int64
	refusedErr string
	// setAside are the org routes the config that serves leaves out (Origins.Suspended).
	setAside atomic.Pointer[[]Origin]
}

// NewServer returns the control plane for opts. It refuses an empty AdminToken unless opts.Listen is a
// loopback address, and then logs at Warn that the control plane runs open.
func NewServer(opts Options) (*Server, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("cannot create the control plane: no store")
	case opts.File == nil || opts.Apply == nil || opts.State == nil:
		return nil, errors.New("cannot create the control plane: File, Apply and State are required")
	}
	s := &Server{
		store:   opts.Store,
		file:    opts.File,
		apply:   opts.Apply,
		state:   opts.State,
		sources: opts.Sources,
		metrics: opts.Metrics,
		log:     opts.Logger,

		drainUsage: opts.Usage,
		pepper:     opts.Store.Pepper(),
	}
	if s.version = opts.Version; s.version == "" {
		s.version = "dev"
	}
	s.applied.Store(opts.Generation)
	if s.replicaID = opts.ReplicaID; s.replicaID == "" {
		s.replicaID = defaultReplicaID()
	}
	d, err := newDashboard()
	if err != nil {
		return nil, err
	}
	s.dashboard = d
	site, err := docs.NewSite()
	if err != nil {
		return nil, err
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "control")
	if opts.AdminToken == "" {
		if !isLoopback(opts.Listen) {
			return nil, fmt.Errorf("cannot start the control plane on %q without a superadmin token: set the environment variable named by [control] admin_token_env, or listen on a loopback address", opts.Listen)
		}
		s.open = true
		s.log.Warn("the control plane runs open: no superadmin token is set, so every local caller without a token is the superadmin", "listen", opts.Listen)
	} else {
		s.admin = sha256.Sum256([]byte(opts.AdminToken))
	}
	s.hosts = newHostSet(opts.Listen, opts.Hosts)
	s.routes()
	s.handler = s.guard(withDocs(site, s.mux))
	return s, nil
}

// isLoopback reports whether the host of listen (host:port) is a loopback address: 127.0.0.0/8, ::1, or
// "localhost" (RFC 6761, section 6.3). An empty host listens on every interface.
func isLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// Handler returns the control plane's handler: the API under /api/v1/, the dashboard under /dashboard/ and
// the documentation under /docs/.
// Every request first passes the guard: the control plane's own names and origin only, JSON writes only.
func (s *Server) Handler() http.Handler { return s.handler }

// Reload composes the live file config with the store and applies it. The caller calls it at start and
// after the file changed (SIGHUP); it returns every problem of the composed config, each named by where it
// is (rolter.toml or an org's provider or route), or the reason the gateway refused it.
func (s *Server) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(context.Background())
}

// applyLocked composes the file config with the store as it is and applies it. s.mu is held.
func (s *Server) applyLocked(ctx context.Context) error {
	st, err := s.store.Load(ctx)
	if err != nil {
		return err
	}
	if err := s.applyState(st); err != nil {
		return err
	}
	s.applied.Store(st.Generation)
	s.refused, s.refusedErr = 0, ""
	return nil
}

// applyState composes the file config with st and applies it. s.mu is held.
func (s *Server) applyState(st *store.State) (err error) {
	cfg, o, err := Compose(s.file(), st)
	if err != nil {
		return fmt.Errorf("cannot compose the config: %w", err)
	}
	for _, sr := range o.Suspended {
		s.log.Warn("an org's route is suspended: rolter.toml routes its model", "org", sr.Org, "model", sr.Name)
	}
	defer func() {
		if err == nil {
			s.setAside.Store(&o.Suspended)
		}
	}()
	if errs := config.Validate(cfg); len(errs) > 0 {
		msgs := make([]string, len(errs))
		for i, e := range errs {
			msgs[i] = describe(e, o)
		}
		return fmt.Errorf("cannot apply the config of rolter.toml and the store: %s", strings.Join(msgs, "; "))
	}
	return s.apply(cfg)
}

// Sync applies the store when its generation moved from the one the gateway serves: how a change made
// through another gateway sharing the store reaches this one (Follower calls it on every notification and
// check). It returns whether it applied a new generation. A generation the gateway refused is not tried
// again until the store moves on (or Reload); a store that cannot be reached is an ErrUnavailable error and
// changes nothing.
func (s *Server) Sync(ctx context.Context) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen, err := s.store.Generation(ctx)
	if err != nil {
		return false, err
	}
	if gen == s.applied.Load() || gen == s.refused {
		return false, nil
	}
	if err := s.applyLocked(ctx); err != nil {
		if !errors.Is(err, store.ErrUnavailable) {
			// The generation read first: a write landing meanwhile is tried at the next notification.
			s.refused, s.refusedErr = gen, err.Error()
		}
		return false, err
	}
	return true, nil
}

// Applied returns the store generation the gateway serves, and why it refused a newer one ("" when it did
// not).
func (s *Server) Applied() (generation int64, refused string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied.Load(), s.refusedErr
}

// caller is who sent a request: the superadmin, or an org admin token.
type caller struct {
	super bool
	org   string // the token's org; "" for the superadmin
	actor string // as the audit log names it: "superadmin" or the token id
}

// access says who may call an endpoint.
type access int

const (
	public    access = iota // no token needed
	anyone                  // any valid token; the handler shows an org token only its org
	orgScoped               // the superadmin, or a token of the org named by the {org} path value
	superOnly               // the superadmin only (an org token gets 403)
)

// endpoint is one operation of the API; openapi.json documents each (TestAPIDocument checks both ways).
type endpoint struct {
	method, path string
	access       access
	handle       func(w http.ResponseWriter, r *http.Request, c *caller) error
}

// routes registers every endpoint, and a fallback that answers unknown paths 404 and known paths with
// another method 405, in the API's error shape.
func (s *Server) routes() {
	s.endpoints = []endpoint{
		{"GET", "/api/v1/openapi.json", public, s.getOpenAPI},
		{"GET", "/api/v1/info", anyone, s.getInfo},
		{"GET", "/api/v1/state", anyone, s.getState},
		{"GET", "/api/v1/metrics", anyone, s.getMetrics},
		{"GET", "/api/v1/audit", superOnly, s.getAudit},
		{"GET", "/api/v1/orgs", anyone, s.listOrgs},
		{"POST", "/api/v1/orgs", superOnly, s.createOrg},
		{"GET", "/api/v1/orgs/{org}", orgScoped, s.getOrg},
		{"DELETE", "/api/v1/orgs/{org}", superOnly, s.deleteOrg},
		{"GET", "/api/v1/orgs/{org}/providers", orgScoped, s.listObjects(providerKind)},
		{"POST", "/api/v1/orgs/{org}/providers", orgScoped, s.createObject(providerKind)},
		{"GET", "/api/v1/orgs/{org}/providers/{name}", orgScoped, s.getObject(providerKind)},
		{"PUT", "/api/v1/orgs/{org}/providers/{name}", orgScoped, s.putObject(providerKind)},
		{"DELETE", "/api/v1/orgs/{org}/providers/{name}", orgScoped, s.deleteObject(providerKind)},
		{"GET", "/api/v1/orgs/{org}/routes", orgScoped, s.listObjects(routeKind)},
		{"POST", "/api/v1/orgs/{org}/routes", orgScoped, s.createObject(routeKind)},
		{"GET", "/api/v1/orgs/{org}/routes/{model}", orgScoped, s.getObject(routeKind)},
		{"PUT", "/api/v1/orgs/{org}/routes/{model}", orgScoped, s.putObject(routeKind)},
		{"DELETE", "/api/v1/orgs/{org}/routes/{model}", orgScoped, s.deleteObject(routeKind)},
		{"GET", "/api/v1/orgs/{org}/limits", orgScoped, s.getOrgLimits},
		{"PUT", "/api/v1/orgs/{org}/limits", superOnly, s.putOrgLimits},
		{"GET", "/api/v1/orgs/{org}/keys", orgScoped, s.listCredentials(keyCredentials)},
		{"POST", "/api/v1/orgs/{org}/keys", orgScoped, s.createCredential(keyCredentials)},
		{"GET", "/api/v1/orgs/{org}/keys/{id}", orgScoped, s.getKey},
		{"DELETE", "/api/v1/orgs/{org}/keys/{id}", orgScoped, s.revokeCredential(keyCredentials)},
		{"PUT", "/api/v1/orgs/{org}/keys/{id}/limits", orgScoped, s.putKeyLimits},
		{"GET", "/api/v1/orgs/{org}/tokens", superOnly, s.listCredentials(tokenCredentials)},
		{"POST", "/api/v1/orgs/{org}/tokens", superOnly, s.createCredential(tokenCredentials)},
		{"DELETE", "/api/v1/orgs/{org}/tokens/{id}", superOnly, s.revokeCredential(tokenCredentials)},
		{"GET", "/api/v1/orgs/{org}/secrets", orgScoped, s.listSecrets},
		{"PUT", "/api/v1/orgs/{org}/secrets/{name}", orgScoped, s.putSecret},
		{"DELETE", "/api/v1/orgs/{org}/secrets/{name}", orgScoped, s.deleteSecret},
		{"GET", "/api/v1/orgs/{org}/audit", orgScoped, s.getOrgAudit},
		{"GET", "/api/v1/orgs/{org}/usage", orgScoped, s.getOrgUsage},
		{"GET", "/api/v1/usage", superOnly, s.getUsage},
	}
	s.mux = http.NewServeMux()
	for _, e := range s.endpoints {
		s.mux.Handle(e.method+" "+e.path, s.wrap(e))
	}
	// The dashboard is static assets calling the API like any client: it needs no token to load, and
	// every call it makes is authenticated as above.
	s.mux.Handle("GET /dashboard/", s.dashboard)
	s.mux.HandleFunc("GET /dashboard", redirectDashboard)
	s.mux.HandleFunc("/", s.fallback)
}

// wrap authenticates and authorises a request for e, runs its handler and writes the error it returns.
func (s *Server) wrap(e endpoint) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Answers may carry secrets (a new key) and always carry state that changes: never cached.
		w.Header().Set("Cache-Control", "no-store")
		c := &caller{super: true, actor: "superadmin"}
		if e.access != public {
			var err error
			if c, err = s.authenticate(r); err != nil {
				s.writeError(w, r, err)
				return
			}
		}
		switch {
		case e.access == superOnly && !c.super:
			s.writeError(w, r, errorf(http.StatusForbidden, "forbidden", "this endpoint is for the superadmin only"))
			return
		case e.access == orgScoped && !c.super && r.PathValue("org") != c.org:
			// Another org's id is answered as if it did not exist: a token learns nothing about other orgs.
			s.writeError(w, r, errOrgNotFound(r.PathValue("org")))
			return
		}
		if err := e.handle(w, r, c); err != nil {
			s.writeError(w, r, err)
		}
	})
}

// authenticate finds the caller of r from its Authorization header (RFC 6750 "Bearer <token>"): the
// superadmin token, compared in constant time, or an org admin token, found by its keyed hash.
func (s *Server) authenticate(r *http.Request) (*caller, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		if s.open {
			return &caller{super: true, actor: "superadmin"}, nil
		}
		return nil, errorf(http.StatusUnauthorized, "unauthorized", "missing Authorization: Bearer <token>")
	}
	scheme, token, ok := strings.Cut(h, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "bearer") || token == "" {
		return nil, errorf(http.StatusUnauthorized, "unauthorized", "the Authorization header is not Bearer <token>")
	}
	if !s.open {
		sum := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(sum[:], s.admin[:]) == 1 {
			return &caller{super: true, actor: "superadmin"}, nil
		}
	}
	org, id, found, err := s.store.TokenByHash(r.Context(), s.secretHash(token))
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errorf(http.StatusUnauthorized, "unauthorized", "invalid or revoked token")
	}
	return &caller{org: org, actor: id}, nil
}

// secretHash is the keyed hash a key or token is stored and looked up by: SHA-256(pepper || secret).
func (s *Server) secretHash(secret string) [32]byte {
	b := make([]byte, 0, len(s.pepper)+len(secret))
	return sha256.Sum256(append(append(b, s.pepper[:]...), secret...))
}

// fallback answers what no endpoint matched: 405 when the path is an endpoint's with another method, else
// 404.
func (s *Server) fallback(w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range []string{"GET", "POST", "PUT", "DELETE"} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := s.mux.Handler(probe); pattern != "/" && pattern != "" {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		s.writeError(w, r, errorf(http.StatusMethodNotAllowed, "method_not_allowed", "method %s is not allowed here; allowed: %s", r.Method, strings.Join(allow, ", ")))
		return
	}
	s.writeError(w, r, errorf(http.StatusNotFound, "not_found", "no API endpoint at %s", r.URL.Path))
}

func (s *Server) getOpenAPI(w http.ResponseWriter, r *http.Request, _ *caller) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(openAPI)
	return nil
}

// getMetrics is the gateway's metrics in the Prometheus text format: every series for the superadmin,
// only its org's routes' and providers' for an org token. The data plane's anonymous /metrics leaves
// the orgs' out (their labels name them).
func (s *Server) getMetrics(w http.ResponseWriter, r *http.Request, c *caller) error {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if s.metrics == nil {
		return nil
	}
	scope := c.org
	if c.super {
		scope = engine.MetricsAll
	}
	s.metrics(w, scope)
	return nil
}

// infoView is GET /api/v1/info (openapi.json's Info).
type infoView struct {
	Version     string `json:"version"`
	Generation  int64  `json:"generation"`
	DocsBaseURL string `json:"docs_base_url"`
	Superadmin  bool   `json:"superadmin"`
}

// getInfo tells a client (the dashboard) what it talks to: the version, the store's generation, and the
// live file's [docs] base_url (the control plane's own /docs when unset), which it links the strategies'
// documentation to.
func (s *Server) getInfo(w http.ResponseWriter, r *http.Request, c *caller) error {
	gen, err := s.store.Generation(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, infoView{Version: s.version, Generation: gen, DocsBaseURL: docsBaseURL(s.file().Docs.BaseURL), Superadmin: c.super})
	return nil
}

// apiError is an answer other than 2xx, in the shape of openapi.json's Error:
// {"error":{"message","type","code","fields","problems"}}.
type apiError struct {
	status   int
	code     string
	msg      string
	fields   []FieldError // the fields of the object written that are wrong (400)
	problems []string     // problems of other objects the change would cause (409)
}

func (e *apiError) Error() string { return e.msg }

func errorf(status int, code, format string, args ...any) *apiError {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func errOrgNotFound(org string) *apiError {
	return errorf(http.StatusNotFound, "not_found", "org %q not found", org)
}

// errorType is OpenAI's error type for a status (engine/errors.go uses the same names).
func errorType(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	}
	if status >= 500 {
		return "server_error"
	}
	return "invalid_request_error"
}

// storeError turns an error of the store into the API's: not found, conflict, invalid; anything else is a
// failure of the store itself (500).
func storeError(err error) error {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, store.ErrNotFound):
		return errorf(http.StatusNotFound, "not_found", "%s", err)
	case errors.Is(err, store.ErrConflict):
		return errorf(http.StatusConflict, "conflict", "%s", err)
	case errors.Is(err, store.ErrInvalid):
		return errorf(http.StatusBadRequest, "invalid_config", "%s", err)
	case errors.Is(err, store.ErrUnavailable):
		return errUnavailable(err)
	}
	return err
}

// errStoredUnapplied is the answer when the store became unreachable between a write and the gateway's
// load of it: the change is stored, and every gateway serves it once the store is back.
func errStoredUnapplied(err error) *apiError {
	return errorf(http.StatusServiceUnavailable, "store_unavailable",
		"the change is stored, but the store became unreachable before this gateway loaded it: the gateways serve it when the store is back (%s)", err)
}

// errUnavailable is the answer when the store cannot be reached (503): nothing can be read or changed, and
// the data plane goes on serving the config it has.
func errUnavailable(err error) *apiError {
	return errorf(http.StatusServiceUnavailable, "store_unavailable",
		"the control plane's store cannot be reached, so nothing can be read or changed now; the gateway keeps serving its last config; retry when the store is back (%s)", err)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if !errors.As(storeError(err), &ae) {
		s.log.Error("control plane request failed", "method", r.Method, "path", r.URL.Path, "error", err.Error())
		ae = errorf(http.StatusInternalServerError, "internal_error", "internal error; the control plane's log has the cause")
	}
	switch ae.status {
	case http.StatusUnauthorized:
		w.Header().Set("WWW-Authenticate", `Bearer realm="rolter"`)
	case http.StatusServiceUnavailable:
		w.Header().Set("Retry-After", "5")
	}
	type body struct {
		Message  string       `json:"message"`
		Type     string       `json:"type"`
		Code     string       `json:"code"`
		Fields   []FieldError `json:"fields,omitempty"`
		Problems []string     `json:"problems,omitempty"`
	}
	writeJSON(w, ae.status, struct {
		Error body `json:"error"`
	}{body{ae.msg, errorType(ae.status), ae.code, ae.fields, ae.problems}})
}

// writeJSON writes v as the JSON body of a status answer.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic("BUG: cannot encode an API answer: " + err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// list is the shape of every list answer.
type list[T any] struct {
	Data []T `json:"data"`
}

func listOf[T any](items []T) list[T] {
	if items == nil {
		items = []T{}
	}
	return list[T]{Data: items}
}
