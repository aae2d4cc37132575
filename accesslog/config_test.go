package accesslog

import (
	"errors"
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.Enabled() || c.Format != FormatJSON || c.Sample != 1 || c.QueueSize != DefaultQueueSize ||
		c.MaxBytes != 100<<20 || c.Keep != 5 {
		t.Fatalf("DefaultConfig = %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("DefaultConfig is invalid: %s", err)
	}
	var z Config
	z.SetDefaults()
	if z.Access != AccessOff || z.Format != FormatJSON || z.Sample != 0 || z.QueueSize != DefaultQueueSize ||
		z.MaxBytes != DefaultMaxBytes || z.Keep != DefaultKeep {
		t.Fatalf("SetDefaults on zero = %+v; want defaults, sample left 0", z)
	}
	again := z
	again.SetDefaults()
	if again != z {
		t.Fatalf("SetDefaults is not idempotent: %+v then %+v", z, again)
	}
}

func TestConfigValidate(t *testing.T) {
	f := func(mod func(c *Config), want ...string) {
		t.Helper()
		c := DefaultConfig()
		c.Access = "stdout"
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
		if !errors.As(err, &ce) || !strings.HasPrefix(ce.Key, "log.") {
			t.Fatalf("error %q is not a *ConfigError naming a log.* key", err)
		}
	}
	f(func(c *Config) {})
	f(func(c *Config) { c.Access = "" })
	f(func(c *Config) { c.Access = "/var/log/rolter/access.log"; c.Format = FormatText })
	f(func(c *Config) { c.Sample = 0; c.SlowMs = 500 })
	f(func(c *Config) { c.Access = AccessOff; c.Sample = 0 })
	f(func(c *Config) { c.Format = "xml" }, `log.format must be "json" or "text", got "xml"`)
	f(func(c *Config) { c.Sample = 1.5 }, "log.sample must be between 0 and 1, got 1.5")
	f(func(c *Config) { c.Sample = -0.1 }, "log.sample must be between 0 and 1")
	f(func(c *Config) { c.SlowMs = -1 }, "log.slow_ms must be 0 (off) or a positive number")
	f(func(c *Config) { c.MaxBytes = -1 }, "log.max_bytes must be positive")
	f(func(c *Config) { c.Keep = -1 }, "log.keep must be positive")
	f(func(c *Config) { c.QueueSize = -1 }, "log.queue_size must be between 1 and")
	f(func(c *Config) { c.QueueSize = 1 << 30 }, "log.queue_size must be between 1 and")
	f(func(c *Config) { c.Sample = 0 }, `log.sample is 0 and slow_ms is 0`, `access = "off"`)
	// Every problem at once.
	f(func(c *Config) { c.Format = "xml"; c.Sample = 2; c.Keep = -3 }, "log.format", "log.sample", "log.keep")
}
