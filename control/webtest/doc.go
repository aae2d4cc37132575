// Package webtest holds the control plane's tests that need tools the gateway's module must not require:
// the dashboard and the cross-origin attacks driven in Debian's Chromium (chromedp; dashboard_test.go,
// guard_test.go) against a real gateway and control plane on loopback, and the OpenAPI checker (apicheck,
// kin-openapi) that validates every API answer, here and in the control package's own tests (which run
// cmd/apicheck). It is a nested module: `make test-modules` runs it.
package webtest
