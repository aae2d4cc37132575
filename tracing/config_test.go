package tracing

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.Enabled() || c.SampleRatio != 0.1 || c.ServiceName != "rolter" || c.QueueSize != 2048 || c.TimeoutSecs != 10 {
		t.Fatalf("DefaultConfig = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig is invalid: %s", err)
	}
	f := func(endpoint, wantProtocol string) {
		t.Helper()
		c := Config{Endpoint: endpoint}
		c.SetDefaults()
		if c.Protocol != wantProtocol || c.ServiceName != DefaultServiceName || c.QueueSize != DefaultQueueSize ||
			c.TimeoutSecs != DefaultTimeoutSecs || c.SampleRatio != 0 {
			t.Fatalf("SetDefaults(%q) = %+v", endpoint, c)
		}
		if c.timeout() != 10*time.Second {
			t.Fatalf("timeout = %v", c.timeout())
		}
	}
	f("", ProtocolHTTP)
	f("http://127.0.0.1:4318", ProtocolHTTP)
	f("https://collector.example:4318/v1/traces", ProtocolHTTP)
	f("grpc://127.0.0.1:4317", ProtocolGRPC)
	f("grpcs://collector.example:4317", ProtocolGRPC)
}

func TestConfigEndpoint(t *testing.T) {
	f := func(endpoint, protocol string, want endpoint) {
		t.Helper()
		c := Config{Endpoint: endpoint, Protocol: protocol}
		got, err := c.endpoint()
		if err != nil || got != want {
			t.Fatalf("endpoint(%q, %q) = %+v, %v; want %+v", endpoint, protocol, got, err, want)
		}
	}
	f("http://127.0.0.1:4318", "", endpoint{url: "http://127.0.0.1:4318/v1/traces"})
	f("http://127.0.0.1:4318/", ProtocolHTTP, endpoint{url: "http://127.0.0.1:4318/v1/traces"})
	f("https://otlp.example/custom/path", "", endpoint{url: "https://otlp.example/custom/path", tls: true})
	f("grpc://127.0.0.1:4317", "", endpoint{hostPort: "127.0.0.1:4317"})
	f("grpcs://collector:4317", "", endpoint{hostPort: "collector:4317", tls: true})
	f("http://collector:4317", ProtocolGRPC, endpoint{hostPort: "collector:4317"})
	f("https://[::1]:4317/", ProtocolGRPC, endpoint{hostPort: "[::1]:4317", tls: true})
}

func TestConfigValidate(t *testing.T) {
	f := func(mod func(c *Config), want ...string) {
		t.Helper()
		c := DefaultConfig()
		c.Endpoint = "http://127.0.0.1:4318"
		mod(&c)
		err := c.Validate()
		if len(want) == 0 {
			if err != nil {
				t.Fatalf("unexpected error: %s", err)
			}
			return
		}
		if err == nil {
			t.Fatalf("no error; want %q", want)
		}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("error %q does not contain %q", err, w)
			}
		}
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, "tracing.") {
			t.Fatalf("error %q is not a *ConfigError naming a tracing.* key", err)
		}
	}
	f(func(c *Config) {})
	f(func(c *Config) { c.Endpoint = "" })
	f(func(c *Config) { c.Endpoint = "grpc://collector:4317" })
	f(func(c *Config) { c.Endpoint = "grpc://collector:4317"; c.Protocol = ProtocolGRPC })
	f(func(c *Config) { c.SampleRatio = 0 })
	f(func(c *Config) { c.Headers = map[string]string{"Authorization": "Bearer x", "x-scope": "a b"} })
	f(func(c *Config) { c.Protocol = "http/json" }, `tracing.protocol must be "http/protobuf" or "grpc", got "http/json"`)
	f(func(c *Config) { c.Endpoint = "127.0.0.1:4318" }, "tracing.endpoint cannot")
	f(func(c *Config) { c.Endpoint = "ftp://collector:21" }, "tracing.endpoint", "scheme must be http or https")
	f(func(c *Config) { c.Endpoint = "http://" }, "tracing.endpoint", "want scheme://host:port")
	f(func(c *Config) { c.Endpoint = "http://u:secret@collector:4318" }, "tracing.endpoint", "credentials belong in tracing.headers")
	f(func(c *Config) { c.Endpoint = "http://collector:4318/v1/traces?x=1" }, "tracing.endpoint", "query")
	f(func(c *Config) { c.Endpoint = "grpc://collector:4317"; c.Protocol = ProtocolHTTP }, `tracing.endpoint cannot use grpc:// with protocol "http/protobuf"`)
	f(func(c *Config) { c.Endpoint = "grpc://collector"; c.Protocol = ProtocolGRPC }, "tracing.endpoint", "needs a port")
	f(func(c *Config) { c.Endpoint = "grpc://collector:4317/x" }, "tracing.endpoint", "no path")
	f(func(c *Config) { c.SampleRatio = 1.5 }, "tracing.sample_ratio must be between 0 and 1, got 1.5")
	f(func(c *Config) { c.SampleRatio = -1 }, "tracing.sample_ratio")
	f(func(c *Config) { c.ServiceName = "a\nb" }, "tracing.service_name")
	f(func(c *Config) { c.Headers = map[string]string{"bad name": "x"} }, `tracing.headers cannot use header name "bad name"`)
	f(func(c *Config) { c.Headers = map[string]string{"x": "a\r\nInjected: 1"} }, `tracing.headers cannot use the value of header "x"`)
	f(func(c *Config) { c.QueueSize = -1 }, "tracing.queue_size")
	f(func(c *Config) { c.TimeoutSecs = -1 }, "tracing.timeout_secs")
	f(func(c *Config) { c.TimeoutSecs = 1e9 }, "tracing.timeout_secs")
	// Every problem at once.
	f(func(c *Config) { c.Protocol = "x"; c.SampleRatio = 2; c.QueueSize = -5 }, "tracing.protocol", "tracing.sample_ratio", "tracing.queue_size")
	// The secret of a URL is not echoed.
	c := DefaultConfig()
	c.Endpoint = "http://u:hunter2@collector:4318"
	if err := c.Validate(); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("error %v echoes the URL's password", err)
	}
}
