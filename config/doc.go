// Package config is rolter.toml's vocabulary: the types of every section (Config and its parts), their
// defaults (Default, SetDefaults), decoding with file:line errors (Load, Parse), validation that reports
// every problem at once (Validate, Errors), and printing the effective config (Effective, WriteTOML).
//
// It knows each routing strategy by name, the parameters it takes and what it needs (Strategies), but not
// how one is built: that is the engine's, whose table of constructors names the same strategies. Nothing
// here imports the data plane, so the control plane, the cluster, the reports and `rolter check` read and
// check configs without linking the engine.
package config
