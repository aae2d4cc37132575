package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/rolter-ai/rolter/engine"
	"github.com/rolter-ai/rolter/internal/syncbuf"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// The tests validate what the API answers against openapi.json with kin-openapi, which the gateway's module
// does not require: the validator is the apicheck command of the nested module control/webtest, built
// once per test binary and asked over a pipe, one JSON line per question and per answer (the shapes below
// are package apicheck's Query and Answer). A test that cannot build or run it fails: no exchange goes
// unchecked.

// specQuery is apicheck.Query: exactly one field is set.
type specQuery struct {
	Exchange   *specExchange    `json:"exchange,omitempty"`
	Operations bool             `json:"operations,omitempty"`
	Schema     *specSchemaQuery `json:"schema,omitempty"`
}

// specExchange is apicheck.Exchange: one request and its answer, as the client saw them.
type specExchange struct {
	Method        string      `json:"method"`
	URL           string      `json:"url"`
	RequestHeader http.Header `json:"request_header"`
	RequestBody   []byte      `json:"request_body"`
	Status        int         `json:"status"`
	Header        http.Header `json:"header"`
	Body          []byte      `json:"body"`
}

// specSchemaQuery is apicheck.SchemaQuery: does Value fit components/schemas/<Name>?
type specSchemaQuery struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
}

// specAnswer is apicheck.Answer.
type specAnswer struct {
	Verdict    *specVerdict    `json:"verdict"`
	Operations []specOperation `json:"operations"`
	Error      string          `json:"error"`
}

// specVerdict is apicheck.Verdict: what is wrong with an exchange; an empty field is no problem.
type specVerdict struct {
	NoRoute  string `json:"no_route"` // openapi.json has no operation for the request
	Request  string `json:"request"`  // answered 2xx, but openapi.json does not allow the request
	Response string `json:"response"` // the answer does not fit openapi.json
}

// specOperation is apicheck.Operation: one operation of openapi.json.
type specOperation struct {
	Method      string   `json:"method"`
	Path        string   `json:"path"`
	OperationID string   `json:"operation_id"`
	Responses   []string `json:"responses"` // documented statuses, sorted
	Public      bool     `json:"public"`    // security: []
}

// specChecker is a running apicheck on the embedded openapi.json. It is safe for concurrent use: one
// question at a time goes over the pipe.
type specChecker struct {
	dir    string // holds the binary and the document
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer

	mu  sync.Mutex
	in  io.WriteCloser
	enc *json.Encoder
	dec *json.Decoder
}

var (
	specOnce sync.Once
	specRun  *specChecker
	specErr  error
)

// spec returns the checker of openapi.json, built and started once for the test binary (stopSpec stops it).
func spec(t *testing.T) *specChecker {
	t.Helper()
	specOnce.Do(func() { specRun, specErr = startSpecChecker() })
	if specErr != nil {
		t.Fatalf("openapi.json: %s", specErr)
	}
	return specRun
}

// stopSpec stops the checker, if it was started, and removes its files.
func stopSpec() {
	if specRun != nil {
		specRun.stop()
	}
}

// startSpecChecker builds control/webtest/cmd/apicheck with the go command that runs the tests, writes the
// embedded openapi.json beside it and starts it. apicheck loads and validates the document first: an
// invalid one ends it, and the first question reports why.
func startSpecChecker() (*specChecker, error) {
	dir, err := os.MkdirTemp("", "rolter-apicheck-")
	if err != nil {
		return nil, err
	}
	c := &specChecker{dir: dir, stderr: &syncbuf.Buffer{}}
	bin, doc := filepath.Join(dir, "apicheck"), filepath.Join(dir, "openapi.json")
	build := exec.Command("go", "build", "-o", bin, "./cmd/apicheck")
	build.Dir = "webtest"
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("cannot build the checker (control/webtest/cmd/apicheck): %s\n%s", err, out)
	}
	if err := os.WriteFile(doc, openAPI, 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c.cmd = exec.Command(bin, doc)
	c.cmd.Stderr = c.stderr
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("cannot start the checker: %w", err)
	}
	c.enc, c.dec = json.NewEncoder(c.in), json.NewDecoder(out)
	if _, err := c.ask(specQuery{Operations: true}); err != nil { // the document loaded and is valid
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *specChecker) stop() {
	c.in.Close()
	_ = c.cmd.Wait()
	os.RemoveAll(c.dir)
}

// ask sends one question and reads its answer.
func (c *specChecker) ask(q specQuery) (specAnswer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var a specAnswer
	err := c.enc.Encode(q)
	if err == nil {
		err = c.dec.Decode(&a)
	}
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) {
			err = errors.New("the checker stopped")
		}
		return a, fmt.Errorf("%s: %s", err, c.stderr.String())
	}
	return a, nil
}

// exchange checks one exchange: the answer always, the request when it was answered 2xx.
func (c *specChecker) exchange(req *http.Request, reqBody []byte, r apiResp) (specVerdict, error) {
	a, err := c.ask(specQuery{Exchange: &specExchange{
		Method: req.Method, URL: req.URL.String(), RequestHeader: req.Header, RequestBody: reqBody,
		Status: r.status, Header: r.header, Body: r.body,
	}})
	if err == nil && a.Verdict == nil {
		err = fmt.Errorf("the checker gave no verdict: %s", a.Error)
	}
	if err != nil {
		return specVerdict{}, err
	}
	return *a.Verdict, nil
}

// operations lists openapi.json's operations.
func (c *specChecker) operations() ([]specOperation, error) {
	a, err := c.ask(specQuery{Operations: true})
	if err == nil && a.Error != "" {
		err = errors.New(a.Error)
	}
	return a.Operations, err
}

// schema checks a JSON text against components/schemas/<name>: it returns what does not fit ("" when it
// fits), or the error that kept it from checking.
func (c *specChecker) schema(name string, data []byte) (string, error) {
	a, err := c.ask(specQuery{Schema: &specSchemaQuery{Name: name, Value: data}})
	return a.Error, err
}

// TestOpenAPILoRAState: an adapter route's state, with every field of its lora object and of its targets'
// adapters set, fits RouteState as the engine encodes it, and so do adapters with the optional fields left
// out; a field the engine does not send does not fit.
func TestOpenAPILoRAState(t *testing.T) {
	check := spec(t)
	slots := 2
	route := engine.RouteState{Model: "sql", Strategy: "cache_aware", Decisions: map[string]uint64{"cache_hit": 1},
		Targets: []engine.TargetState{
			{Provider: "p", Model: "sql", Weight: 1, Eligible: true,
				Adapters: &engine.AdapterState{Registered: []string{"chat", "sql"}, Running: []string{"sql"}, Waiting: []string{"chat"}, MaxLoRA: &slots}},
			{Provider: "q", Model: "sql", Weight: 2, Eligible: true, Adapters: &engine.AdapterState{}},
		},
		LoRA: &engine.LoRAState{Adapter: "sql", Base: "llama", Order: []string{"q", "p"}, K: 1, KMin: 1, KMax: 2,
			Home: []string{"p"}, Holders: []string{"p"}, Inflight: 3, Dynamic: true, Loads: 4, LoadFailures: 1}}
	data, err := json.Marshal(route)
	if err != nil {
		t.Fatal(err)
	}
	fits := func(what string, data []byte, want bool) {
		t.Helper()
		bad, err := check.schema("RouteState", data)
		if err != nil {
			t.Fatalf("%s: cannot check against openapi.json: %s", what, err)
		}
		if (bad == "") != want {
			t.Fatalf("%s: fits RouteState %v, want %v (%s)\n%s", what, bad == "", want, bad, data)
		}
	}
	fits("every field", data, true)
	for _, field := range []string{`"adapter":"sql",`, `"holders":["p"],`, `,"load_failures":1`} {
		fits("without "+field, []byte(strings.Replace(string(data), field, "", 1)), false)
	}
	fits("an unknown lora field", []byte(strings.Replace(string(data), `"dynamic":true`, `"dynamic":true,"slots":2`, 1)), false)
	fits("an unknown adapters field", []byte(strings.Replace(string(data), `"max_lora":2`, `"max_lora":2,"loaded":[]`, 1)), false)
	fits("null holders", []byte(strings.Replace(string(data), `"holders":["p"]`, `"holders":null`, 1)), false)
}
