package fleet

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// WriteReport writes name.md (markdown) and name.json (v) into dir, creating it, and returns their paths.
func WriteReport(dir, name, markdown string, v any) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create %q: %w", dir, err)
	}
	md := filepath.Join(dir, name+".md")
	if err := os.WriteFile(md, []byte(markdown), 0o644); err != nil {
		return nil, fmt.Errorf("cannot write %q: %w", md, err)
	}
	js := filepath.Join(dir, name+".json")
	if err := WriteJSON(js, v); err != nil {
		return nil, err
	}
	return []string{md, js}, nil
}

// WriteJSON writes v as indented JSON, with a final newline, to path.
func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode %q: %w", path, err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("cannot write %q: %w", path, err)
	}
	return nil
}

// EscapePipes escapes the pipes of s, so it stays one cell of a Markdown table.
func EscapePipes(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

// FirstLine returns s up to its first newline.
func FirstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// VersionsLine renders a report's "Versions:" line (name: `version`, by name), or "" for none.
func VersionsLine(versions map[string]string) string {
	if len(versions) == 0 {
		return ""
	}
	v := make([]string, 0, len(versions))
	for _, k := range SortedKeys(versions) {
		v = append(v, fmt.Sprintf("%s: `%s`", k, versions[k]))
	}
	return "Versions: " + strings.Join(v, ", ") + ".\n"
}

// SortedKeys returns m's keys in order.
func SortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// FormatCounts renders "a 3, b 1", the largest first.
func FormatCounts(m map[string]int) string {
	keys := SortedKeys(m)
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && m[keys[j]] > m[keys[j-1]]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// OrDefault sets *v to d when *v is the zero value.
func OrDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}
