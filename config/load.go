package config

import (
	"errors"
	"fmt"
	"os"

	"github.com/BurntSushi/toml"
)

// Load reads and validates the config at path. On any problem it returns Errors listing all of them.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read config %q: %w", path, err)
	}
	return Parse(data, path)
}

// Parse decodes data strictly (unknown keys are errors), applies defaults and validates everything.
// file names the source in error messages.
func Parse(data []byte, file string) (*Config, error) {
	cfg := Default()
	cfg.File = file
	lines := scanKeyLines(data)
	v := &validator{file: file, lines: lines}

	md, err := toml.Decode(string(data), cfg)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			v.errs = append(v.errs, &Error{File: file, Line: pe.Position.Line, Msg: pe.Message})
			return nil, v.errs
		}
		// Type mismatches carry the key in the message; find its line.
		msg := err.Error()
		v.errs = append(v.errs, &Error{File: file, Line: lines.firstLineMentioning(msg), Msg: msg})
		return nil, v.errs
	}
	seen := map[string]int{}
	for _, k := range md.Undecoded() {
		plain := k.String()
		line := lines.nthLine(plain, seen[plain])
		seen[plain]++
		v.errs = append(v.errs, &Error{File: file, Line: line, Key: plain, Msg: "unknown key"})
	}
	if k := controlWithoutEnabled(md); k != "" {
		// A [control] table without enabled would be silently off: its listen, store and token unused.
		v.errs = append(v.errs, &Error{File: file, Line: lines.lineOf("control"), Key: "control.enabled",
			Msg: "[control] sets " + k + " but not enabled: the control plane starts only with enabled = true (write enabled = false to keep it off)"})
	}
	cfg.SetDefaults()
	v.validate(cfg)
	if len(v.errs) > 0 {
		return nil, v.errs
	}
	return cfg, nil
}

// Validate checks a config built in code (the control plane's, composed from the file and its store)
// exactly as Parse checks a file - one validation path: it sets the defaults cfg lacks (changing cfg) and
// checks it. Problems are returned all at once. Each problem's Key is its path
// ("providers[3].kv_events.endpoint"); the lines of a config that did not come from a file are unknown.
func Validate(cfg *Config) Errors {
	v := &validator{file: cfg.File}
	cfg.SetDefaults()
	v.validate(cfg)
	return v.errs
}

// controlWithoutEnabled returns a value of [control] itself (listen, store...) that the file sets while it
// does not set enabled, or "". A table under it ([control.quotas]) is not one: it applies to orgs
// whichever way the control plane runs.
func controlWithoutEnabled(md toml.MetaData) string {
	if md.IsDefined("control", "enabled") {
		return ""
	}
	for _, k := range md.Keys() {
		if len(k) == 2 && k[0] == "control" && md.Type(k...) != "Hash" {
			return k[1]
		}
	}
	return ""
}
