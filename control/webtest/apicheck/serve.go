package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// The apicheck command's protocol: one JSON Query per line on stdin, one JSON Answer per line on stdout, in
// order. The control package's tests (control/openapi_test.go) write the same shapes; they run in the
// gateway's module, which cannot import this one.

// Query is one question to the checker: exactly one of its fields is set.
type Query struct {
	Exchange   *Exchange    `json:"exchange,omitempty"`
	Operations bool         `json:"operations,omitempty"`
	Schema     *SchemaQuery `json:"schema,omitempty"`
}

// Exchange is one request to the control plane and its answer, as the client saw them.
type Exchange struct {
	Method        string      `json:"method"`
	URL           string      `json:"url"` // absolute, as sent
	RequestHeader http.Header `json:"request_header"`
	RequestBody   []byte      `json:"request_body"`
	Status        int         `json:"status"`
	Header        http.Header `json:"header"`
	Body          []byte      `json:"body"`
}

// SchemaQuery asks whether Value fits the component schema Name.
type SchemaQuery struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
}

// Answer is the checker's reply to one Query.
type Answer struct {
	Verdict    *Verdict    `json:"verdict,omitempty"`    // to an Exchange
	Operations []Operation `json:"operations,omitempty"` // to Operations
	// Error is the schema check's finding, or why the query could not be answered.
	Error string `json:"error,omitempty"`
}

// Serve answers the queries read from in on out until in ends. It returns nil at the end of in, or the
// error that stopped it.
func (c *Checker) Serve(in io.Reader, out io.Writer) error {
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	for {
		var q Query
		if err := dec.Decode(&q); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("cannot read a query: %w", err)
		}
		if err := enc.Encode(c.answer(q)); err != nil {
			return fmt.Errorf("cannot write an answer: %w", err)
		}
	}
}

func (c *Checker) answer(q Query) Answer {
	switch {
	case q.Exchange != nil:
		x := q.Exchange
		req, err := http.NewRequest(x.Method, x.URL, bytes.NewReader(x.RequestBody))
		if err != nil {
			return Answer{Error: fmt.Sprintf("cannot rebuild the request: %s", err)}
		}
		req.Header = x.RequestHeader
		if req.Header == nil {
			req.Header = http.Header{}
		}
		v := c.Exchange(req, x.RequestBody, x.Status, x.Header, x.Body)
		return Answer{Verdict: &v}
	case q.Operations:
		return Answer{Operations: c.Operations()}
	case q.Schema != nil:
		if err := c.Schema(q.Schema.Name, q.Schema.Value); err != nil {
			return Answer{Error: err.Error()}
		}
		return Answer{}
	}
	return Answer{Error: "an empty query"}
}
