package accesslog

import (
	"errors"
	"fmt"
	"math"

	"github.com/rolter-ai/rolter/logfile"
)

// Values of Config.Access and Config.Format.
const (
	AccessOff  = "off"
	FormatJSON = "json"
	FormatText = "text"
)

// Defaults of Config (DefaultConfig; SetDefaults fills the zero fields but Sample, where 0 is a setting).
const (
	DefaultSample    = 1.0
	DefaultQueueSize = 4096
	DefaultMaxBytes  = logfile.DefaultMaxBytes
	DefaultKeep      = logfile.DefaultKeep
)

// maxQueueSize bounds queue_size: a queued Record is 408 bytes, so 1<<20 of them are 408 MiB (the
// default 4096, 1.6 MiB).
const maxQueueSize = 1 << 20

// Config is the access-log part of the [log] section of rolter.toml. Field names are the TOML keys; the
// JSON names (control plane, `rolter check -print`) are the same.
type Config struct {
	// Access is where lines go: "off" (or "": no access log), "stdout", "stderr", or a file path (its
	// directory must exist; the file is created with mode 0600 and rotated by max_bytes and keep).
	Access string `toml:"access" json:"access"`
	// Format is "json" (one object per line) or "text" (key=value pairs).
	Format string `toml:"format" json:"format"`
	// Sample is the fraction of requests logged, 0..1. 0 logs only the requests slow_ms selects.
	Sample float64 `toml:"sample" json:"sample"`
	// SlowMs: a request that takes this long or longer is always logged, whatever Sample says (0: off).
	SlowMs int `toml:"slow_ms" json:"slow_ms"`
	// MaxBytes and Keep rotate a file destination: past MaxBytes the file becomes access.log.1 and at most
	// Keep rotated files are kept.
	MaxBytes int64 `toml:"max_bytes" json:"max_bytes"`
	Keep     int   `toml:"keep" json:"keep"`
	// QueueSize is how many finished requests may wait for the writer; past it lines are dropped and
	// counted (Logger.Dropped), never waited for.
	QueueSize int `toml:"queue_size" json:"queue_size"`
}

// DefaultConfig is the access log of a config without the keys: off, and the defaults every other key
// takes once it is turned on. Decoding starts from it, so an absent sample is 1 and sample = 0 stays 0.
func DefaultConfig() Config {
	return Config{
		Access:    AccessOff,
		Format:    FormatJSON,
		Sample:    DefaultSample,
		MaxBytes:  DefaultMaxBytes,
		Keep:      DefaultKeep,
		QueueSize: DefaultQueueSize,
	}
}

// SetDefaults fills the zero fields of c with their defaults. Sample is left alone: 0 is a setting
// (slow requests only), and its default comes from DefaultConfig.
func (c *Config) SetDefaults() {
	if c.Access == "" {
		c.Access = AccessOff
	}
	if c.Format == "" {
		c.Format = FormatJSON
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Keep == 0 {
		c.Keep = DefaultKeep
	}
	if c.QueueSize == 0 {
		c.QueueSize = DefaultQueueSize
	}
}

// Enabled reports whether c turns the access log on.
func (c *Config) Enabled() bool { return c.Access != "" && c.Access != AccessOff }

// ConfigError is one problem of a Config: the key at fault, as written in rolter.toml ("log.sample"),
// and what is wrong with its value.
type ConfigError struct {
	Key string
	Msg string
}

func (e *ConfigError) Error() string { return e.Key + " " + e.Msg }

// Validate reports every problem of c at once, as *ConfigError values joined with errors.Join. Zero
// values are accepted where SetDefaults would fill them. The file itself is not touched: a destination
// that cannot be opened is an error of New.
func (c *Config) Validate() error {
	var errs []error
	add := func(key, format string, args ...any) {
		errs = append(errs, &ConfigError{Key: "log." + key, Msg: fmt.Sprintf(format, args...)})
	}
	switch c.Format {
	case "", FormatJSON, FormatText:
	default:
		add("format", "must be %q or %q, got %q", FormatJSON, FormatText, c.Format)
	}
	if math.IsNaN(c.Sample) || c.Sample < 0 || c.Sample > 1 {
		add("sample", "must be between 0 and 1, got %v", c.Sample)
	}
	if c.SlowMs < 0 {
		add("slow_ms", "must be 0 (off) or a positive number of milliseconds, got %d", c.SlowMs)
	}
	if c.MaxBytes < 0 {
		add("max_bytes", "must be positive, got %d", c.MaxBytes)
	}
	if c.Keep < 0 {
		add("keep", "must be positive, got %d", c.Keep)
	}
	if c.QueueSize < 0 || c.QueueSize > maxQueueSize {
		add("queue_size", "must be between 1 and %d, got %d", maxQueueSize, c.QueueSize)
	}
	if c.Enabled() && c.Sample == 0 && c.SlowMs == 0 {
		add("sample", "is 0 and slow_ms is 0: no request would be logged; set access = %q instead", AccessOff)
	}
	return errors.Join(errs...)
}
