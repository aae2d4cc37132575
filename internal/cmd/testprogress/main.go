// Command testprogress reads `go test -json` on stdin and prints one line per package as it finishes (go
// test's own output holds a package's lines until those listed before it are done), the whole output of
// every failed test and build, and a last line with the totals. It exits 1 when a package failed or did
// not build, so `go test -json ./... | testprogress` fails as go test would.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// event is the part of a test2json event (go doc test2json) this reads.
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string
	FailedBuild string
}

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	start := time.Now()
	var (
		output                  = map[string]*strings.Builder{} // package or package/test -> its output so far
		build                   = map[string]*strings.Builder{} // import path -> its build output
		passed, failed, skipped int
		failures                []string
	)
	text := func(m map[string]*strings.Builder, k string) *strings.Builder {
		b := m[k]
		if b == nil {
			b = &strings.Builder{}
			m[k] = b
		}
		return b
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event (go's own complaint, say): shown as it came.
			fmt.Fprintln(out, sc.Text())
			continue
		}
		key := e.Package + " " + e.Test
		switch e.Action {
		case "build-output":
			text(build, e.ImportPath).WriteString(e.Output)
		case "build-fail":
			fmt.Fprintf(out, "FAIL build %s\n%s", e.ImportPath, build[e.ImportPath])
		case "output":
			text(output, key).WriteString(e.Output)
		case "fail":
			if e.Test != "" {
				failures = append(failures, e.Package+" "+e.Test)
				fmt.Fprintf(out, "--- FAIL %s %s\n%s", e.Package, e.Test, output[key])
				continue
			}
			failed++
			if e.FailedBuild != "" {
				fmt.Fprintf(out, "FAIL %s (build of %s failed)\n", e.Package, e.FailedBuild)
				continue
			}
			fmt.Fprintf(out, "FAIL %-50s %7.1fs  [%s]\n%s", e.Package, e.Elapsed, since(start), lastLines(output[key], 30))
		case "pass", "skip":
			if e.Test != "" {
				delete(output, key)
				continue
			}
			if e.Action == "skip" {
				skipped++ // no test files
				continue
			}
			passed++
			delete(output, key)
			fmt.Fprintf(out, "ok   %-50s %7.1fs  [%s]\n", e.Package, e.Elapsed, since(start))
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testprogress:", err)
		return 1
	}
	fmt.Fprintf(out, "%d packages passed, %d failed, %d without tests, in %s\n", passed, failed, skipped, since(start))
	for _, f := range failures {
		fmt.Fprintln(out, "failed:", f)
	}
	if failed > 0 || passed == 0 {
		return 1
	}
	return 0
}

func since(t time.Time) string { return time.Since(t).Round(time.Second).String() }

// lastLines is the end of a failed package's output (its failed tests were shown in full already).
func lastLines(b *strings.Builder, n int) string {
	if b == nil {
		return ""
	}
	lines := strings.SplitAfter(b.String(), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}
