// Package limits is the rate limiting of data-plane keys and orgs: requests and tokens per minute as GCRA
// buckets (Bucket), requests in flight (Gauge), the limits of one subject (Scope), and what one request
// holds of them from admission to its end (Reservation): reserve its cost before it is sent, settle on what
// it used. Everything on the request path is lock-free and allocation-free. It imports only the standard
// library; the data plane (engine) builds the scopes from the config and writes OpenAI's rate-limit headers
// from a Reservation's Status (docs/configuration/limits.md).
package limits
