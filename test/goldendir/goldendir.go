// Package goldendir finds the golden captures: the real Linux rdma_rxe
// traffic (*.pcap, each with a .txt of the commands and values) kept in the
// repository at testdata/golden, or wherever $ROCEV2_GOLDEN points.
//
// It is the one place that knows where the captures are. It is a leaf: it
// imports only the standard library, so the tests of any package — the wire
// packages icrc and packet included, which test/golden itself imports —
// may use it without an import cycle. It is the only package under test/
// that tests of product packages may import (test/layering enforces that).
// Reading and interpreting the captures is test/golden's job.
//
// A test that needs the captures calls Require: without them it is skipped
// with a loud message, or fails when CI=true, where the captures must be
// present. A fuzz target whose synthetic seeds run anyway calls Seeds.
package goldendir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// Env names the environment variable that overrides the directory.
const Env = "ROCEV2_GOLDEN"

// RepoPath is where the captures live, relative to the module root (the
// directory holding go.mod). The repository carries them, so a clone tests
// itself with nothing beside it.
const RepoPath = "testdata/golden"

// Dir returns the directory holding the golden captures: $ROCEV2_GOLDEN if
// set, else testdata/golden in the directory holding go.mod, found by
// walking up from the working directory (a test's working directory is its
// package's). The error says where it looked when that directory does not
// exist or holds no *.pcap.
func Dir() (string, error) {
	dir := os.Getenv(Env)
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return "", err
		}
		for d := wd; ; {
			if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
				dir = filepath.Join(d, RepoPath)
				break
			}
			p := filepath.Dir(d)
			if p == d {
				return "", fmt.Errorf("no go.mod above %s; set $%s", wd, Env)
			}
			d = p
		}
	}
	where, hint := dir, "; set $"+Env
	if os.Getenv(Env) != "" {
		where, hint = "$"+Env+"="+dir, ""
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return "", fmt.Errorf("%s is not a directory%s", where, hint)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "*.pcap")); len(m) == 0 {
		return "", fmt.Errorf("no *.pcap in %s%s", where, hint)
	}
	return dir, nil
}

// Require returns the golden directory. Without it the test is skipped
// with a loud message naming what did not run — or fails when CI=true.
func Require(tb testing.TB) string {
	tb.Helper()
	dir, err := Dir()
	if err != nil {
		msg := fmt.Sprintf("GOLDEN CAPTURES NOT FOUND (%v): %s did NOT run", err, tb.Name())
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return dir
}

// Seeds is Require for a fuzz target that runs without the captures on its
// synthetic seeds: it returns the directory and true, or logs loudly that
// the target runs WITHOUT its golden seeds and returns false — or fails
// when CI=true.
func Seeds(tb testing.TB) (string, bool) {
	tb.Helper()
	dir, err := Dir()
	if err != nil {
		Missing(tb, err)
		return "", false
	}
	return dir, true
}

// Missing reports, for a fuzz target, that its golden seeds are missing for
// the reason err (Seeds does this; a target that found the directory but no
// usable packet in it calls it too): a loud log line, or a failure when
// CI=true.
func Missing(tb testing.TB, err error) {
	tb.Helper()
	if err == nil {
		err = errors.New("no golden packets")
	}
	msg := fmt.Sprintf("GOLDEN CAPTURES NOT FOUND (%v): %s runs WITHOUT its golden seeds", err, tb.Name())
	if os.Getenv("CI") == "true" {
		tb.Fatal(msg)
	}
	tb.Log(msg)
}

// PCAPs returns the paths of every *.pcap in the golden directory, sorted;
// without the captures the test is skipped loudly (fails when CI=true).
func PCAPs(tb testing.TB) []string {
	tb.Helper()
	return Files(Require(tb))
}

// Files returns the paths of the *.pcap in dir, sorted.
func Files(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	sort.Strings(m)
	return m
}
