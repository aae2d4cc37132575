package telemetry

import (
	"bytes"
	"io"
	"sync"

	"github.com/VictoriaMetrics/metrics"
)

// WritePrometheus writes every registered metric in the Prometheus text format, process metrics included,
// with each family as one group: its # HELP and # TYPE lines once, then all its samples.
//
// The series of one family come from several sets - one per provider, per route and target, per KV source,
// so that each can be registered and unregistered as reloads add and remove them - and the metrics library
// writes set after set, repeating a family's metadata in each. The text format allows one TYPE line per
// family and needs a family's samples together (strict parsers such as the Go client's expfmt reject the
// rest), so the output is regrouped here. It is the /metrics handler's only writer; safe for concurrent use.
func WritePrometheus(w io.Writer) { WritePrometheusKeeping(w, nil) }

// WritePrometheusKeeping is WritePrometheus writing only the samples keep returns true for (nil keeps
// them all). keep gets one sample line, valid only during the call; a family whose samples are all left
// out is left out whole.
func WritePrometheusKeeping(w io.Writer, keep func(sample []byte) bool) {
	buf := expoBufs.Get().(*bytes.Buffer)
	buf.Reset()
	metrics.WritePrometheus(buf, true)
	regroup(w, buf.Bytes(), keep)
	expoBufs.Put(buf)
}

// LabelValue returns the raw (still escaped) value of label name in a sample line, or false.
func LabelValue(sample []byte, name string) ([]byte, bool) {
	open := bytes.IndexByte(sample, '{')
	if open < 0 {
		return nil, false
	}
	for i := open + 1; i < len(sample); {
		eq := bytes.IndexByte(sample[i:], '=')
		if eq < 0 || i+eq+1 >= len(sample) || sample[i+eq+1] != '"' {
			return nil, false
		}
		n := sample[i : i+eq]
		start := i + eq + 2
		j := start
		for j < len(sample) && sample[j] != '"' {
			if sample[j] == '\\' {
				j++
			}
			j++
		}
		if j >= len(sample) {
			return nil, false
		}
		if string(n) == name {
			return sample[start:j], true
		}
		i = j + 1
		if i < len(sample) && sample[i] == ',' {
			i++
		}
		if i >= len(sample) || sample[i] == '}' {
			return nil, false
		}
	}
	return nil, false
}

var expoBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// famGroup is one metric family's lines in the order first seen.
type famGroup struct {
	help, typ []byte
	samples   [][]byte
}

// regroup writes the lines of text grouped by family, families in the order they first appear, the
// samples keep refuses left out (nil keeps all).
func regroup(w io.Writer, text []byte, keep func([]byte) bool) {
	var order []string
	fams := map[string]*famGroup{}
	get := func(name []byte) *famGroup {
		f := fams[string(name)]
		if f == nil {
			f = &famGroup{}
			fams[string(name)] = f
			order = append(order, string(name))
		}
		return f
	}
	// histogram and summary families own their _bucket, _sum and _count samples.
	compound := map[string]bool{}
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = nil
		}
		if len(line) == 0 {
			continue
		}
		if line[0] == '#' {
			f := bytes.Fields(line)
			if len(f) < 3 || (string(f[1]) != "HELP" && string(f[1]) != "TYPE") {
				continue
			}
			fam := get(f[2])
			if string(f[1]) == "HELP" {
				if fam.help == nil {
					fam.help = line
				}
			} else if fam.typ == nil {
				fam.typ = line
				if len(f) > 3 && (string(f[3]) == "histogram" || string(f[3]) == "summary") {
					compound[string(f[2])] = true
				}
			}
			continue
		}
		end := bytes.IndexAny(line, "{ ")
		if end < 0 {
			end = len(line)
		}
		name := line[:end]
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base := bytes.TrimSuffix(name, []byte(suffix)); len(base) < len(name) && compound[string(base)] {
				name = base
				break
			}
		}
		if keep != nil && !keep(line) {
			continue
		}
		fam := get(name)
		fam.samples = append(fam.samples, line)
	}
	var out bytes.Buffer
	for _, name := range order {
		f := fams[name]
		if keep != nil && len(f.samples) == 0 {
			continue
		}
		for _, l := range [][]byte{f.help, f.typ} {
			if l != nil {
				out.Write(l)
				out.WriteByte('\n')
			}
		}
		for _, l := range f.samples {
			out.Write(l)
			out.WriteByte('\n')
		}
	}
	_, _ = w.Write(out.Bytes())
}
