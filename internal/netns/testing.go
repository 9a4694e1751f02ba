//go:build linux

package netns

import (
	"os"
	"os/exec"
)

// TB is the part of testing.TB the test helpers use (so that this package
// does not import testing).
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
}

// Require skips t with a loud message when namespaces cannot be made here
// (not root, or no iproute2 ip) — or fails it when CI=true, where the
// namespace tests must run. The ones named in tools must be installed too
// (e.g. "tc", "tcpdump").
func Require(t TB, tools ...string) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "network namespaces and veth pairs need root"
	} else {
		for _, tool := range append([]string{"ip"}, tools...) {
			if _, err := exec.LookPath(tool); err != nil {
				why = "'" + tool + "' is not installed (iproute2, tcpdump, ...)"
				break
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but %s: the namespace test cannot run", why)
	}
	t.Skipf("SKIPPED LOUDLY (network namespace test): %s", why)
}

// TestPair is NewPair for a test: Require first, fatal on error, removed
// at cleanup.
func TestPair(t TB, c PairConfig) *Pair {
	t.Helper()
	Require(t)
	p, err := NewPair(c)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestNew is New for a test: Require first, fatal on error, deleted at
// cleanup.
func TestNew(t TB, prefix string) string {
	t.Helper()
	Require(t)
	ns, err := New(prefix)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { Delete(ns) })
	return ns
}

// MustGet is Get for a test: fatal on error.
func MustGet[V any](t TB, ns string, f func() (V, error)) V {
	t.Helper()
	v, err := Get(ns, f)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return v
}
