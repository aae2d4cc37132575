package instructions

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rolter-ai/rolter/bench/fleet"
	"github.com/rolter-ai/rolter/bench/overhead"
	"github.com/valyala/fasthttp"
)

// Options configure the instruction count. Zero values take the defaults named.
type Options struct {
	// Rolter is the gateway binary, Upstream the fake upstream binary (as for the overhead report) and
	// Valgrind valgrind (default: looked up in PATH). RefProxy, when set, is bench/cmd/refproxy's binary:
	// the small case is then also counted through its two modes, the yardsticks.
	Rolter, Upstream, Valgrind, RefProxy string
	// Requests counted per case (4000), after Warmup requests (500; the cache_aware case at least 8 times
	// what its tries hold, so that they evict) at Concurrency keep-alive connections (4).
	Requests, Warmup, Concurrency int
	// Top is how many functions the report lists per case, by their own instructions (25).
	Top int
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// Test hooks: upstreamAddr is an upstream already listening (Upstream is then not started);
	// routingMemory the cache_aware gateway's routing_memory_bytes (16 MiB).
	upstreamAddr  string
	routingMemory int
}

// DefaultOptions are the defaults of the fields an Options leaves zero.
func DefaultOptions() Options {
	return Options{Requests: 4000, Warmup: 500, Concurrency: 4, Top: 25}
}

func (o *Options) normalize() error {
	d := DefaultOptions()
	fleet.OrDefault(&o.Requests, d.Requests)
	fleet.OrDefault(&o.Warmup, d.Warmup)
	fleet.OrDefault(&o.Concurrency, d.Concurrency)
	fleet.OrDefault(&o.Top, d.Top)
	fleet.OrDefault(&o.Log, io.Discard)
	fleet.OrDefault(&o.routingMemory, 16<<20)
	if o.Valgrind == "" {
		o.Valgrind, _ = exec.LookPath("valgrind")
	}
	var errs []error
	if o.Rolter == "" || (o.Upstream == "" && o.upstreamAddr == "") {
		errs = append(errs, errors.New("missing the rolter or the fake upstream binary"))
	}
	if o.Valgrind == "" {
		errs = append(errs, errors.New("valgrind not found (make bench-instructions installs it)"))
	}
	if o.Requests < o.Concurrency || o.Concurrency < 1 || o.Warmup < 0 {
		errs = append(errs, fmt.Errorf("requests (%d) must be at least the concurrency (%d), which must be positive", o.Requests, o.Concurrency))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot count instructions: %w", err)
	}
	return nil
}

// Report is the instruction count of each case.
type Report struct {
	Date     string            `json:"date"`
	Versions map[string]string `json:"versions"`
	Cases    []*Case           `json:"cases"`
	// References are the small case through refproxy's modes (Options.RefProxy).
	References []*Case       `json:"references,omitempty"`
	Options    Options       `json:"-"`
	Seconds    float64       `json:"seconds"`
	Machine    fleet.Machine `json:"machine"`
}

// Case is one case's count.
type Case struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Requests    int     `json:"requests"`
	Errors      int     `json:"errors"`
	Total       int64   `json:"instructions"`
	PerRequest  float64 `json:"instructions_per_request"`
	// Top are the functions with the most instructions of their own (callees not included).
	Top []FuncCount `json:"top"`
}

// FuncCount is one function's own instructions per request and share of the total.
type FuncCount struct {
	Func       string  `json:"func"`
	PerRequest float64 `json:"instructions_per_request"`
	Share      float64 `json:"share"`
}

// instructionEnv is the environment of the gateway under valgrind: asynchronous preemption off (its
// signals only slow valgrind down), RDTSCP off, which valgrind 3.19 cannot run (the runtime then reads the
// clock with RDTSC), and the garbage collector off, so that whether a cycle falls into the counted requests
// does not move the count (the request path allocates nothing; what allocates elsewhere is bounded by the
// run).
var instructionEnv = []string{"GODEBUG=asyncpreemptoff=1,cpu.rdtscp=off", "GOGC=off"}

// Run counts the instructions per request of `rolter serve` in the overhead report's two cases.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.normalize(); err != nil {
		return nil, err
	}
	started := time.Now()
	rep := &Report{Date: started.UTC().Format(time.RFC3339), Versions: map[string]string{}, Options: o,
		Machine: fleet.DescribeMachine()}
	if out, err := exec.Command(o.Rolter, "version").Output(); err == nil {
		rep.Versions["rolter"] = string(bytes.TrimSpace(out))
	}
	if out, err := exec.Command(o.Valgrind, "--version").Output(); err == nil {
		rep.Versions["valgrind"] = string(bytes.TrimSpace(out))
	}
	upstream := o.upstreamAddr
	if upstream == "" {
		up, addr, err := fleet.StartProc("fake upstream", o.Upstream, []string{"-listen", "127.0.0.1:0"}, "listening http://", 10*time.Second)
		if err != nil {
			return nil, err
		}
		defer up.Stop()
		upstream = addr
	}
	if _, err := exec.LookPath("cg_diff"); err != nil {
		return nil, fmt.Errorf("cannot count instructions: cg_diff (from valgrind) not found: %w", err)
	}

	oo := overhead.DefaultOptions()
	cases := overhead.NewCases(&oo)
	for _, c := range cases {
		ic, err := countCase(ctx, &o, c, rolterGateway(&o, c, upstream))
		if err != nil {
			return nil, fmt.Errorf("case %s: %w", c.Name, err)
		}
		rep.Cases = append(rep.Cases, ic)
	}
	if o.RefProxy != "" {
		small := cases[slices.IndexFunc(cases, func(c *overhead.Case) bool { return c.Name == overhead.CaseSmall })]
		for _, mode := range []string{"goroutine", "fasthttp", "lean"} {
			g := gateway{name: "refproxy -mode " + mode, cmd: func(addr, _ string) ([]string, error) {
				return []string{o.RefProxy, "-mode", mode, "-listen", addr, "-upstream", upstream}, nil
			}}
			ic, err := countCase(ctx, &o, small, g)
			if err != nil {
				return nil, fmt.Errorf("case %s through %s: %w", small.Name, g.name, err)
			}
			ic.Name = g.name
			rep.References = append(rep.References, ic)
		}
	}
	rep.Seconds = time.Since(started).Seconds()
	return rep, nil
}

// gateway is what runs under cachegrind: cmd returns its command line to listen on addr, given a
// temporary folder for its files.
type gateway struct {
	name string
	cmd  func(addr, dir string) ([]string, error)
}

// rolterGateway is `rolter serve` with case c's config; the cache_aware case's tries get o.routingMemory.
func rolterGateway(o *Options, c *overhead.Case, upstream string) gateway {
	routingMemory := 0
	if c.PromptBytes > 0 {
		routingMemory = o.routingMemory
	}
	return gateway{name: "rolter", cmd: func(addr, dir string) ([]string, error) {
		cfgPath := filepath.Join(dir, "rolter-"+c.Name+".toml")
		if err := os.WriteFile(cfgPath, []byte(overhead.RolterConfig(c, addr, upstream, routingMemory)), 0o644); err != nil {
			return nil, fmt.Errorf("cannot write %q: %w", cfgPath, err)
		}
		return []string{o.Rolter, "serve", "-config", cfgPath, "-log-level", "warn"}, nil
	}}
}

// countCase measures one case: two runs of its gateway under cachegrind, the first with the warm-up only,
// the second with the warm-up and the counted requests; the difference is what the counted requests cost.
// (Cachegrind charges every instruction to the function it is in. Callgrind, which can zero and dump a
// running process, follows calls and loses track at goroutine switches: it charged fasthttp's getNextProto
// with most of a request.)
func countCase(ctx context.Context, o *Options, c *overhead.Case, g gateway) (*Case, error) {
	ic := &Case{Name: c.Name, Requests: o.Requests}
	ic.Description = fmt.Sprintf("%s over %d target(s), %d-byte bodies", c.Strategy, c.Targets, c.BodyBytes)
	dir, err := os.MkdirTemp("", "rolter-instructions-")
	if err != nil {
		return nil, fmt.Errorf("cannot make a temporary folder: %w", err)
	}
	defer os.RemoveAll(dir)
	warmup := o.Warmup
	if c.PromptBytes > 0 {
		// Tries of 16 MiB in all (4 MiB each over 4 targets: about 500 prompts of 8 KiB), so that the warm-up
		// fills them and every counted request inserts and evicts, as in the overhead report.
		warmup = max(warmup, 8*(o.routingMemory/max(c.PromptBytes, 1)))
	}
	base, _, err := cachegrindRun(ctx, o, c, g, dir, warmup, 0) // warm-up failures are errors
	if err != nil {
		return nil, err
	}
	counted, failed, err := cachegrindRun(ctx, o, c, g, dir, warmup, o.Requests)
	if err != nil {
		return nil, err
	}
	ic.Errors = failed
	t0, err := cachegrindTotal(base)
	if err != nil {
		return nil, err
	}
	t1, err := cachegrindTotal(counted)
	if err != nil {
		return nil, err
	}
	ic.Total = t1 - t0
	ic.PerRequest = float64(ic.Total) / float64(o.Requests)
	diff := filepath.Join(dir, "cachegrind.diff")
	out, err := exec.Command("cg_diff", base, counted).Output()
	if err != nil {
		return nil, fmt.Errorf("cg_diff: %w", err)
	}
	if err := os.WriteFile(diff, out, 0o644); err != nil {
		return nil, err
	}
	annotated, err := exec.Command("cg_annotate", "--auto=no", "--threshold=0.05", diff).Output()
	if err != nil {
		return nil, fmt.Errorf("cg_annotate %s: %w", diff, err)
	}
	// A binary without symbols (a stripped build, a go test binary) has no function list.
	ic.Top = topFuncs(annotated, ic.Total, o.Requests, o.Top)
	return ic, nil
}

// cachegrindRun runs c's gateway under cachegrind, sends warmup then n requests, stops it and returns its
// cachegrind file and how many of the requests failed.
func cachegrindRun(ctx context.Context, o *Options, c *overhead.Case, g gateway, dir string, warmup, n int) (string, int, error) {
	port, err := fleet.FreePort()
	if err != nil {
		return "", 0, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd, err := g.cmd(addr, dir)
	if err != nil {
		return "", 0, err
	}
	out := filepath.Join(dir, fmt.Sprintf("cachegrind-%d.out", n))
	args := append([]string{"--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=" + out}, cmd...)
	gw, _, err := fleet.StartProcEnv(g.name+" under cachegrind ("+c.Name+")", o.Valgrind, args, instructionEnv, "", 0)
	if err != nil {
		return "", 0, err
	}
	defer gw.Stop()
	if err := fleet.WaitHTTP(ctx, "http://"+addr+"/healthz", 120*time.Second, gw); err != nil {
		return "", 0, fmt.Errorf("%s under cachegrind did not come up: %w", g.name, err)
	}
	client := &fasthttp.HostClient{Addr: addr, MaxConns: o.Concurrency, ReadTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	var seq atomic.Uint64 // the same bodies in every run
	fmt.Fprintf(o.Log, "instructions %s through %s: %d warm-up and %d counted requests\n", c.Name, g.name, warmup, n)
	failed := countedLoop(ctx, client, addr, c, warmup, o.Concurrency, &seq)
	if failed > 0 {
		return "", failed, fmt.Errorf("%d of %d warm-up requests failed: %s", failed, warmup, gw.Tail())
	}
	if c.PromptBytes > 0 {
		snap, err := overhead.ReadTrieSnapshot(addr, c)
		if err != nil {
			return "", 0, err
		}
		if snap.Evictions == 0 {
			return "", 0, fmt.Errorf("the tries did not evict after %d warm-up requests", warmup)
		}
	}
	failed = countedLoop(ctx, client, addr, c, n, o.Concurrency, &seq)
	client.CloseIdleConnections()
	// The file is written when the process exits: let it drain and exit rather than kill it.
	if err := gw.Terminate(2 * time.Minute); err != nil {
		return "", failed, err
	}
	if _, err := os.Stat(out); err != nil {
		return "", failed, fmt.Errorf("cachegrind wrote no file: %w: %s", err, gw.Tail())
	}
	return out, failed, nil
}

// countedLoop sends n of c's requests over conc connections and returns how many failed.
func countedLoop(ctx context.Context, client *fasthttp.HostClient, addr string, c *overhead.Case, n, conc int, seq *atomic.Uint64) int {
	var left, failed atomic.Int64
	left.Store(int64(n))
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := overhead.NewRequest(addr)
			defer fasthttp.ReleaseRequest(req)
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseResponse(resp)
			var buf []byte
			for left.Add(-1) >= 0 && ctx.Err() == nil {
				buf = c.AppendBody(buf[:0], seq.Add(1)-1)
				req.SetBodyRaw(buf)
				if err := client.DoTimeout(req, resp, 60*time.Second); err != nil || resp.StatusCode() != fasthttp.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

// cachegrindTotal reads the instruction total of a cachegrind file (its "summary:" line).
func cachegrindTotal(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "summary:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(rest), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: bad summary line %q", path, sc.Text())
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no summary line", path)
}

// annotatedLine is a line of cg_annotate's function list: "1,234 ( 4.36%)  file:function [object]".
var annotatedLine = regexp.MustCompile(`^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(\S.*?)(?:\s+\[[^\]]*\])?\s*$`)

// topFuncs returns the n functions with the most instructions from cg_annotate's output, per request. A
// function whose code comes from several files (inlined callees) is listed once, with its parts summed.
func topFuncs(annotated []byte, total int64, requests, n int) []FuncCount {
	sums := map[string]int64{}
	inList := false
	for _, line := range strings.Split(string(annotated), "\n") {
		if strings.Contains(line, "file:function") {
			inList = true
			continue
		}
		if !inList {
			continue
		}
		if strings.HasPrefix(line, "-----") && len(sums) > 0 {
			break // the list ends; what may follow is annotated source
		}
		m := annotatedLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		ir, err := strconv.ParseInt(strings.ReplaceAll(m[1], ",", ""), 10, 64)
		if err != nil {
			continue
		}
		name := m[2]
		if i := strings.LastIndex(name, ":"); i >= 0 {
			name = name[i+1:] // drop the file
		}
		if strings.HasPrefix(name, "0x") || name == "???" {
			continue
		}
		sums[name] += ir
	}
	out := make([]FuncCount, 0, len(sums))
	for name, ir := range sums {
		out = append(out, FuncCount{Func: name, PerRequest: float64(ir) / float64(requests), Share: float64(ir) / float64(max(total, 1))})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerRequest != out[j].PerRequest {
			return out[i].PerRequest > out[j].PerRequest
		}
		return out[i].Func < out[j].Func
	})
	return out[:min(n, len(out))]
}
