// Package control is the control plane of Rolter: orgs, their providers, routes, data-plane keys and admin
// tokens, kept in a store (package control/store: a SQLite file, or a PostgreSQL database shared by many
// gateways) and served under /api/v1. It composes the file's config with the store's objects (compose.go),
// keeps every gateway of a fleet on the store's latest generation (follower.go) and serves the dashboard.
package control
