// Package helm holds the tests of the Helm chart in rolter/ (chart_test.go): helm lint and helm template
// from helm's Go module, and a strict Kubernetes schema check of every rendered manifest.
package helm
