// Package apicheck checks exchanges with the control plane against its OpenAPI document (control/openapi.json)
// with kin-openapi. It lives in the nested module control/webtest so that kin-openapi stays out of the
// gateway's go.mod: the control package's own tests reach it through the apicheck command (a line protocol
// on stdin and stdout, Serve), the browser tests of this module call it directly.
package apicheck

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// Checker holds one OpenAPI document, validated, and the router that finds its operations. It is safe for
// concurrent use: it only reads the document.
type Checker struct {
	doc    *openapi3.T
	router routers.Router
}

// Load parses the document, validates it as OpenAPI 3 and builds its router.
func Load(data []byte) (*Checker, error) {
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		return nil, fmt.Errorf("cannot load openapi.json: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi.json is not a valid OpenAPI 3 document: %w", err)
	}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("cannot route openapi.json's operations: %w", err)
	}
	return &Checker{doc: doc, router: router}, nil
}

// Verdict is what Exchange found wrong with one exchange; an empty field is no problem.
type Verdict struct {
	// NoRoute: the document has no operation for the request (the other fields are then empty).
	NoRoute string `json:"no_route,omitempty"`
	// Request: the request was answered 2xx, but the document does not allow it.
	Request string `json:"request,omitempty"`
	// Response: the answer (status, headers and body) does not fit the document.
	Response string `json:"response,omitempty"`
}

// Exchange checks one exchange: the answer always, the request only when it was answered 2xx (a refused
// request may well be one the document does not allow). req's body is replaced by reqBody.
func (c *Checker) Exchange(req *http.Request, reqBody []byte, status int, header http.Header, body []byte) Verdict {
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		return Verdict{NoRoute: err.Error()}
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		MultiError:            true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	var v Verdict
	if status/100 == 2 {
		if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
			v.Request = err.Error()
		}
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		v.Response = err.Error()
	}
	return v
}

// Operation is one operation of the document, as the tests compare it with the endpoints served.
type Operation struct {
	Method      string   `json:"method"` // upper case
	Path        string   `json:"path"`   // the document's path template, /api/v1/orgs/{org}
	OperationID string   `json:"operation_id"`
	Responses   []string `json:"responses"` // the documented statuses ("200", "default"), sorted
	// Public is true when the operation's security is empty (security: []): no authentication.
	Public bool `json:"public"`
}

// Operations lists every operation of the document, sorted by path and method.
func (c *Checker) Operations() []Operation {
	var ops []Operation
	for path, item := range c.doc.Paths.Map() {
		for method, op := range item.Operations() {
			o := Operation{Method: method, Path: path, OperationID: op.OperationID, Public: op.Security != nil && len(*op.Security) == 0}
			if op.Responses != nil {
				for code := range op.Responses.Map() {
					o.Responses = append(o.Responses, code)
				}
			}
			slices.Sort(o.Responses)
			ops = append(ops, o)
		}
	}
	slices.SortFunc(ops, func(a, b Operation) int {
		return cmp.Or(cmp.Compare(a.Path, b.Path), cmp.Compare(a.Method, b.Method))
	})
	return ops
}

// Schema checks a JSON text against the document's component schema name (components/schemas/<name>).
func (c *Checker) Schema(name string, data []byte) error {
	ref := c.doc.Components.Schemas[name]
	if ref == nil || ref.Value == nil {
		return fmt.Errorf("openapi.json has no schema %q", name)
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("cannot decode %s: %w", data, err)
	}
	return ref.Value.VisitJSON(v)
}
