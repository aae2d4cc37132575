package tracing

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Values of Config.Protocol.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Defaults of Config (DefaultConfig; SetDefaults fills the zero fields but SampleRatio, where 0 is a
// setting).
const (
	DefaultSampleRatio = 0.1
	DefaultServiceName = "rolter"
	DefaultQueueSize   = 2048
	DefaultTimeoutSecs = 10.0
	// DefaultHTTPPath is the OTLP/HTTP path added to an endpoint that has none.
	DefaultHTTPPath = "/v1/traces"
)

const (
	// maxQueueSize bounds queue_size: a queued Span is 880 bytes, so 1<<16 of them are 55 MiB, plus as
	// many finished SDK spans in the batch processor.
	maxQueueSize   = 1 << 16
	maxTimeoutSecs = 300.0
)

// Config is the [tracing] section of rolter.toml. Field names are the TOML keys; the JSON names (control
// plane, `rolter check -print`) are the same.
type Config struct {
	// Endpoint is the OTLP collector ("" = tracing off). With http/protobuf, an http:// or https:// URL;
	// without a path, /v1/traces is added ("http://otel-collector:4318"). With grpc, grpc://host:port
	// (plain text) or grpcs://host:port (TLS); http:// and https:// mean the same there. It is dialled
	// through the gateway's egress policy.
	Endpoint string `toml:"endpoint" json:"endpoint"`
	// Protocol is "http/protobuf" or "grpc"; empty: grpc for a grpc:// or grpcs:// endpoint, else
	// http/protobuf.
	Protocol string `toml:"protocol" json:"protocol"`
	// SampleRatio is the fraction of new traces sampled (requests without a traceparent), 0..1. A request
	// that comes with one follows its caller's sampled flag whatever this says.
	SampleRatio float64 `toml:"sample_ratio" json:"sample_ratio"`
	// ServiceName is the service.name of the spans.
	ServiceName string `toml:"service_name" json:"service_name"`
	// Headers are sent with every export (HTTP headers, or gRPC metadata), e.g. a collector's API key.
	Headers map[string]string `toml:"headers" json:"headers,omitempty"`
	// QueueSize bounds the spans waiting for export: past it spans are dropped and counted
	// (Exporter.Dropped). The batch processor holds as many again.
	QueueSize int `toml:"queue_size" json:"queue_size"`
	// TimeoutSecs bounds one export, retries included.
	TimeoutSecs float64 `toml:"timeout_secs" json:"timeout_secs"`
}

// DefaultConfig is the tracing of a config without [tracing]: off, and the defaults every other key takes
// once an endpoint is set. Decoding starts from it, so an absent sample_ratio is 0.1 and
// sample_ratio = 0 stays 0 (only callers' sampled traces are exported).
func DefaultConfig() Config {
	return Config{
		SampleRatio: DefaultSampleRatio,
		ServiceName: DefaultServiceName,
		QueueSize:   DefaultQueueSize,
		TimeoutSecs: DefaultTimeoutSecs,
	}
}

// SetDefaults fills the zero fields of c with their defaults, the protocol from the endpoint's scheme.
// SampleRatio is left alone: 0 is a setting, and its default comes from DefaultConfig.
func (c *Config) SetDefaults() {
	if c.Protocol == "" {
		c.Protocol = ProtocolHTTP
		if s, _, ok := strings.Cut(c.Endpoint, "://"); ok && (s == "grpc" || s == "grpcs") {
			c.Protocol = ProtocolGRPC
		}
	}
	if c.ServiceName == "" {
		c.ServiceName = DefaultServiceName
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
	if c.TimeoutSecs == 0 {
		c.TimeoutSecs = DefaultTimeoutSecs
	}
}

// Enabled reports whether c turns tracing on.
func (c *Config) Enabled() bool { return c.Endpoint != "" }

// timeout is TimeoutSecs as a duration (the default for 0).
func (c *Config) timeout() time.Duration {
	if c.TimeoutSecs == 0 {
		return time.Duration(DefaultTimeoutSecs * float64(time.Second))
	}
	return time.Duration(c.TimeoutSecs * float64(time.Second))
}

// ConfigError is one problem of a Config: the key at fault, as written in rolter.toml
// ("tracing.sample_ratio"), and what is wrong with its value.
type ConfigError struct {
	Key string
	Msg string
}

func (e *ConfigError) Error() string { return e.Key + " " + e.Msg }

// Validate reports every problem of c at once, as *ConfigError values joined with errors.Join. Zero
// values are accepted where SetDefaults would fill them. The endpoint's host is not checked against the
// egress policy here (the engine does that with the policy it has); its addresses are checked when
// dialled.
func (c *Config) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: "tracing." + key, Msg: fmt.Sprintf(format, args...)})
	}
	switch c.Protocol {
	case "", ProtocolHTTP, ProtocolGRPC:
	default:
		add("protocol", "must be %q or %q, got %q", ProtocolHTTP, ProtocolGRPC, c.Protocol)
	}
	if c.Endpoint != "" {
		if _, err := c.endpoint(); err != nil {
			add("endpoint", "%s", err)
		}
	}
	if math.IsNaN(c.SampleRatio) || c.SampleRatio < 0 || c.SampleRatio > 1 {
		add("sample_ratio", "must be between 0 and 1, got %v", c.SampleRatio)
	}
	if strings.ContainsFunc(c.ServiceName, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		add("service_name", "must not contain control characters, got %q", c.ServiceName)
	}
	for _, name := range slices.Sorted(maps.Keys(c.Headers)) {
		value := c.Headers[name]
		if !isToken(name) {
			add("headers", "cannot use header name %q: want an HTTP token (letters, digits, -)", name)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			add("headers", "cannot use the value of header %q: it contains CR, LF or NUL", name)
		}
	}
	if c.QueueSize < 0 || c.QueueSize > maxQueueSize {
		add("queue_size", "must be between 1 and %d, got %d", maxQueueSize, c.QueueSize)
	}
	if math.IsNaN(c.TimeoutSecs) || c.TimeoutSecs < 0 || c.TimeoutSecs > maxTimeoutSecs {
		add("timeout_secs", "must be between 0 and %v seconds, got %v", maxTimeoutSecs, c.TimeoutSecs)
	}
	return errors.Join(errs...)
}

// endpoint is where the exporter connects: a URL for http/protobuf, host:port and TLS for grpc.
type endpoint struct {
	url      string // http/protobuf: the full URL, path included
	hostPort string // grpc: the dial target
	tls      bool
}

// endpoint checks c.Endpoint against c.Protocol (with the default protocol for "").
func (c *Config) endpoint() (endpoint, error) {
	u, err := url.Parse(c.Endpoint)
	if err != nil {
		return endpoint{}, fmt.Errorf("cannot parse URL %q: %w", c.Endpoint, err)
	}
	proto := c.Protocol
	if proto == "" {
		cc := Config{Endpoint: c.Endpoint}
		cc.SetDefaults()
		proto = cc.Protocol
	}
	if u.Host == "" || u.Hostname() == "" {
		return endpoint{}, fmt.Errorf("cannot use URL %q: want scheme://host:port, e.g. http://127.0.0.1:4318", c.Endpoint)
	}
	if u.User != nil {
		return endpoint{}, fmt.Errorf("cannot use URL %q: credentials belong in tracing.headers, not in the URL", redact(u))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return endpoint{}, fmt.Errorf("cannot use URL %q: it must not have a query or fragment", c.Endpoint)
	}
	switch proto {
	case ProtocolHTTP:
		switch u.Scheme {
		case "http", "https":
		case "grpc", "grpcs":
			return endpoint{}, fmt.Errorf("cannot use %s:// with protocol %q: set tracing.protocol = %q, or use an http:// URL", u.Scheme, proto, ProtocolGRPC)
		default:
			return endpoint{}, fmt.Errorf("cannot use URL %q: the scheme must be http or https", c.Endpoint)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = DefaultHTTPPath
		}
		return endpoint{url: u.String(), tls: u.Scheme == "https"}, nil
	case ProtocolGRPC:
		switch u.Scheme {
		case "grpc", "grpcs", "http", "https":
		default:
			return endpoint{}, fmt.Errorf("cannot use URL %q: the scheme must be grpc, grpcs, http or https", c.Endpoint)
		}
		if u.Path != "" && u.Path != "/" {
			return endpoint{}, fmt.Errorf("cannot use URL %q: a gRPC endpoint has no path", c.Endpoint)
		}
		if u.Port() == "" {
			return endpoint{}, fmt.Errorf("cannot use URL %q: a gRPC endpoint needs a port (4317 by convention)", c.Endpoint)
		}
		return endpoint{hostPort: u.Host, tls: u.Scheme == "grpcs" || u.Scheme == "https"}, nil
	}
	return endpoint{}, fmt.Errorf("cannot use URL %q: unknown protocol %q", c.Endpoint, proto)
}

func redact(u *url.URL) string {
	v := *u
	v.User = url.User("xxxxx")
	return v.String()
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
