// Package netns runs a test in a network namespace of its own, for tests that need addresses a real
// network would give engines but that must stay on loopback: inside, the loopback interface is up and
// also holds Range, so servers bind 10.213.x.y and clients reach them over lo, and nothing the test does
// reaches the host's network. Kubernetes refuses loopback addresses in EndpointSlices; these it takes.
//
// The namespace is made with unshare(2) (a user namespace mapping the caller to root, and a network
// namespace), by running the test binary again; `ip` (iproute2) sets up its loopback interface.
package netns

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Range is the prefix every address of which is local inside the namespace.
var Range = netip.MustParsePrefix("10.213.0.0/16")

// childEnv marks the test binary run inside the namespace.
const childEnv = "ROLTER_NETNS_CHILD"

// RequireEnv set to 1 makes a machine that cannot make the namespace fail the test instead of skipping it.
const RequireEnv = "ROLTER_REQUIRE_NETNS"

// Addr is the i-th address of Range (i >= 1).
func Addr(i int) netip.Addr {
	b := Range.Addr().As4()
	return netip.AddrFrom4([4]byte{b[0], b[1], byte(i >> 8), byte(i)})
}

// Run runs the calling test inside a new network namespace and reports whether the caller is that
// run: a test calls it first and returns when it reports false (its outcome is the namespaced run's).
//
//	func TestX(t *testing.T) {
//		if !netns.Run(t) {
//			return
//		}
//		... // inside: Addr(1), Addr(2)... can be bound
//	}
func Run(t *testing.T) bool {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		if err := setUp(); err != nil {
			t.Fatalf("cannot set up the network namespace: %v", err)
		}
		return true
	}
	if _, err := exec.LookPath("ip"); err != nil {
		skipOrFail(t, "no ip command (Debian's iproute2): %v", err)
		return false
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.v", "-test.count=1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout="+fmt.Sprint(max(1, int(time.Until(d).Seconds())))+"s")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	out, err := cmd.CombinedOutput()
	text := strings.TrimRight(string(out), "\n")
	if err != nil && strings.Contains(err.Error(), "operation not permitted") {
		skipOrFail(t, "this machine cannot make a network namespace: %v", err)
		return false
	}
	t.Log("in a network namespace of its own:\n" + text)
	if err != nil {
		t.Fatalf("the test failed in its network namespace: %v", err)
	}
	if strings.Contains(text, "--- SKIP") {
		t.Skip("skipped in its network namespace")
	}
	return false
}

// setUp brings the namespace's loopback interface up and makes every address of Range local.
func setUp() error {
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		{"route", "add", "local", Range.String(), "dev", "lo"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format+" (%s=1 fails instead)", append(args, RequireEnv)...)
}
