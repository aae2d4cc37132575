// Package store is the control plane's persistent state: orgs, their providers, routes, data-plane keys,
// admin tokens and secrets, the audit log and the replicas' reports, in one SQLite file (sqlite.go) or one
// PostgreSQL database that every gateway of a fleet shares (postgres.go). Both have the same schema,
// migrated by migrate.go from the embedded migrations/, and the same methods: the queries are written
// once, in SQLite's SQL, and rewritten for PostgreSQL (dialect.go).
//
// Every write is one transaction that bumps the store's generation and appends one audit row (open.go);
// Load reads everything a gateway needs as one consistent State (state.go). Each kind of object has its
// file: orgs.go, providers.go and routes.go (which share versioned.go), keys.go and tokens.go (which share
// credentials.go), secrets.go, audit.go and replicas.go.
//
// The store knows nothing of the gateway: configs are opaque JSON to it, and it imports neither the
// control plane's API nor the data plane.
package store
