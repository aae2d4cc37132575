package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The crash test writes to a store in a re-executed test binary (TestStoreCrashChild) and kills it.

const crashChildEnv = "ROLTER_STORE_CRASH_CHILD"

// TestStoreCrashChild is the writer of TestStoreCrash. It opens the store at $ROLTER_STORE_CRASH_CHILD,
// creates org "crash" and then writes until killed (or for 30 s), printing "ack <n>" after write n
// committed: odd n create provider "p<n>" with config {"n":n}; even n replace provider "counter" with
// {"n":n}, expecting the version it wrote last.
func TestStoreCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("the child process of TestStoreCrash")
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	o, err := s.CreateOrg(bg, su, "crash")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("ack 0 %s\n", o.ID)
	version := int64(0)
	deadline := time.Now().Add(30 * time.Second) // bounded if the parent never kills
	for n := 1; time.Now().Before(deadline); n++ {
		cfg := fmt.Appendf(nil, `{"n":%d}`, n)
		if n%2 == 1 {
			err = s.CreateProvider(bg, su, o.ID, "p"+strconv.Itoa(n), cfg)
		} else {
			_, version, err = s.PutProvider(bg, su, o.ID, "counter", cfg, version)
		}
		if err != nil {
			t.Fatal(err)
		}
		// os.Stdout is unbuffered: the line is in the pipe when Printf returns.
		if _, err := fmt.Printf("ack %d\n", n); err != nil {
			return // the parent is gone
		}
	}
}

// TestStoreCrash: a writer killed with SIGKILL at a random moment loses no write it acknowledged, and the
// store opens and passes quick_check afterwards. (SIGKILL leaves the page cache to the kernel: this checks
// the commit protocol, not fsync against power loss, which synchronous=FULL is for.)
func TestStoreCrash(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("SIGKILL")
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	start := time.Now()
	for round := 0; round < 5; round++ {
		path := filepath.Join(t.TempDir(), "rolter.db")
		killAfter := 5 + rng.IntN(60)
		delay := time.Duration(rng.IntN(20000)) * time.Microsecond
		last, orgID := crashWriter(t, path, killAfter, delay)

		s, err := Open(path)
		if err != nil {
			t.Fatalf("round %d: the store does not open after the crash: %v", round, err)
		}
		st, err := s.Load(bg)
		if err != nil {
			t.Fatal(err)
		}
		// The child writes one at a time: at most one write committed without its ack reaching us.
		if st.Generation < int64(1+last) || st.Generation > int64(2+last) {
			t.Fatalf("round %d: generation %d after %d acknowledged writes (and the org)", round, st.Generation, last)
		}
		committed := int(st.Generation) - 1
		providers := map[string]int{}
		for _, p := range st.Providers {
			if p.OrgID != orgID {
				t.Fatalf("round %d: provider of org %q", round, p.OrgID)
			}
			var c struct{ N int }
			if err := json.Unmarshal(p.Config, &c); err != nil {
				t.Fatalf("round %d: provider %q: %v", round, p.Name, err)
			}
			providers[p.Name] = c.N
			if p.Name == "counter" && (p.Version != int64(committed/2) || c.N != committed/2*2) {
				t.Fatalf("round %d: counter at version %d with n %d after %d writes", round, p.Version, c.N, committed)
			}
		}
		for n := 1; n <= committed; n += 2 {
			if providers["p"+strconv.Itoa(n)] != n {
				t.Fatalf("round %d: write %d (acknowledged: %v) is lost", round, n, n <= last)
			}
		}
		// Nothing else: a "p<n>" for every odd write, and "counter" from the second write on.
		if want := (committed+1)/2 + min(committed/2, 1); len(st.Providers) != want {
			t.Fatalf("round %d: %d providers after %d writes, want %d", round, len(st.Providers), committed, want)
		}
		if es, _ := s.Audit(bg, "", 1000); int64(len(es)) != st.Generation {
			t.Fatalf("round %d: %d audit rows at generation %d", round, len(es), st.Generation)
		}
		// The store goes on.
		if _, _, err := s.PutProvider(bg, su, orgID, "after", []byte(`{}`), 0); err != nil {
			t.Fatal(err)
		}
		s.Close()
		t.Logf("round %d: killed %s after ack %d; last ack %d, generation %d", round, delay, killAfter, last, st.Generation)
	}
	t.Logf("5 rounds in %s", time.Since(start).Round(time.Millisecond))
}

// crashWriter runs TestStoreCrashChild on path, kills it delay after its killAfter-th ack, and returns the
// last write it acknowledged and its org.
func crashWriter(t *testing.T, path string, killAfter int, delay time.Duration) (last int, orgID string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStoreCrashChild$", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() }) // whatever happens below
	defer timer.Stop()
	last = -1
	killed := false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "ack" {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n != last+1 {
			t.Fatalf("ack %q after ack %d", sc.Text(), last)
		}
		last = n
		if n == 0 && len(f) == 3 {
			orgID = f[2]
		}
		if n == killAfter && !killed {
			killed = true
			time.Sleep(delay) // the kill lands anywhere in a later write
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
		// After the kill, the acks already in the pipe still count: they were printed after commits.
	}
	err = cmd.Wait()
	if !killed || orgID == "" {
		t.Fatalf("the writer ended before the kill (last ack %d): %v\n%s", last, err, stderr.String())
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the writer was not killed: %v\n%s", err, stderr.String())
	}
	return last, orgID
}
