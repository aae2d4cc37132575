package config

import (
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// keyLines maps indexed key paths ("routes[1].targets[0].provider") to the line that sets them.
//
// BurntSushi/toml does not expose key positions, and its key names do not tell the elements of an array of
// tables apart, so validation errors would otherwise say "routes.targets.provider" without saying which one.
// This is a line scanner for the subset of TOML that config files use (tables, arrays of tables, key = value,
// inline tables, multi-line arrays and strings); it only feeds error messages, never decoding.
type keyLines struct {
	line  map[string]int
	order []string // paths in document order
}

var tomlBareKey = regexp.MustCompile(`^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=`)

func scanKeyLines(data []byte) keyLines {
	kl := keyLines{line: map[string]int{}}
	counts := map[string]int{} // array-of-tables path (indexed parent) -> elements seen
	table := ""                // current indexed table path
	depth := 0                 // open brackets of a multi-line array value
	inString := ""             // open multi-line string delimiter
	for i, raw := range bytes.Split(data, []byte("\n")) {
		lineNo := i + 1
		line := string(raw)
		if inString != "" {
			if strings.Contains(line, inString) {
				inString = ""
			}
			continue
		}
		if depth > 0 {
			depth += bracketDelta(line)
			continue
		}
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || trimmed[0] == '#' {
			continue
		}
		if strings.HasPrefix(trimmed, "[[") {
			end := strings.Index(trimmed, "]]")
			if end < 0 {
				continue
			}
			name := normaliseKey(trimmed[2:end])
			parent := indexParent(name, counts)
			n := counts[parent]
			counts[parent] = n + 1
			table = fmt.Sprintf("%s[%d]", parent, n)
			kl.add(table, lineNo)
			continue
		}
		if trimmed[0] == '[' {
			end := strings.IndexByte(trimmed, ']')
			if end < 0 {
				continue
			}
			name := normaliseKey(trimmed[1:end])
			table = indexParent(name, counts)
			kl.add(table, lineNo)
			continue
		}
		m := tomlBareKey.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := normaliseKey(m[1])
		path := key
		if table != "" {
			path = table + "." + key
		}
		kl.add(path, lineNo)
		value := line[len(m[0]):]
		if strings.Count(value, `"""`)%2 == 1 {
			inString = `"""`
		} else if strings.Count(value, `'''`)%2 == 1 {
			inString = `'''`
		} else {
			depth = bracketDelta(value)
			if depth < 0 {
				depth = 0
			}
		}
	}
	return kl
}

// indexParent turns a dotted table name into an indexed path, resolving each prefix that is an array of
// tables to its latest element: "routes.targets" -> "routes[2].targets".
func indexParent(name string, counts map[string]int) string {
	parts := strings.Split(name, ".")
	path := ""
	for i, p := range parts {
		if path != "" {
			path += "."
		}
		path += p
		if i < len(parts)-1 {
			if n, ok := counts[path]; ok && n > 0 {
				path = fmt.Sprintf("%s[%d]", path, n-1)
			}
		}
	}
	return path
}

func normaliseKey(s string) string {
	parts := strings.Split(s, ".")
	for i, p := range parts {
		parts[i] = strings.Trim(strings.TrimSpace(p), `"'`)
	}
	return strings.Join(parts, ".")
}

func bracketDelta(s string) int {
	d := 0
	inStr := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case inStr != 0:
			if c == '\\' && inStr == '"' {
				i++
			} else if c == inStr {
				inStr = 0
			}
		case c == '"' || c == '\'':
			inStr = c
		case c == '#':
			return d
		case c == '[' || c == '{':
			d++
		case c == ']' || c == '}':
			d--
		}
	}
	return d
}

func (kl *keyLines) add(path string, line int) {
	if _, ok := kl.line[path]; !ok {
		kl.line[path] = line
	}
	kl.order = append(kl.order, path)
}

// lineOf returns the line of path, or of its nearest ancestor that has one, or 0.
func (kl *keyLines) lineOf(path string) int {
	for path != "" {
		if n, ok := kl.line[path]; ok {
			return n
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// nthLine returns the line of the n-th occurrence (document order) of a key given without indexes,
// as BurntSushi/toml reports undecoded keys.
func (kl *keyLines) nthLine(plain string, n int) int {
	for _, p := range kl.order {
		if stripIndexes(p) == plain {
			if n == 0 {
				return kl.line[p]
			}
			n--
		}
	}
	return 0
}

// firstLineMentioning finds a line for a decode error message that quotes a key, e.g.
// `toml: line 4 (last key "routes.targets.weight"): incompatible types`.
func (kl *keyLines) firstLineMentioning(msg string) int {
	var line int
	if _, err := fmt.Sscanf(msg, "toml: line %d", &line); err == nil {
		return line
	}
	return 0
}

func stripIndexes(p string) string {
	var b strings.Builder
	skip := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '[':
			skip = true
		case c == ']':
			skip = false
		case !skip:
			b.WriteByte(c)
		}
	}
	return b.String()
}
