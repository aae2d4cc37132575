package telemetry

// The series of data-plane keys' usage: one per org, key and public model that was used (bounded by the
// config's keys and routes), hidden from the anonymous /metrics and shown to the key's org.
const (
	TenantRequests = "rolter_tenant_requests_total" // {org,key,model,result} counter: answered | refused (by a limit)
	TenantTokens   = "rolter_tenant_tokens_total"   // {org,key,model,kind} counter: prompt | cached | completion
)
