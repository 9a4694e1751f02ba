package goldendir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDirEnv(t *testing.T) {
	d := t.TempDir()
	t.Setenv(Env, d)
	if _, err := Dir(); err == nil || !strings.Contains(err.Error(), "no *.pcap") {
		t.Errorf("empty dir: %v", err)
	}
	for _, n := range []string{"b.pcap", "a.pcap", "a.txt"} {
		if err := os.WriteFile(filepath.Join(d, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := Dir(); err != nil || got != d {
		t.Errorf("Dir() = %q, %v; want %q", got, err, d)
	}
	if got := Files(d); len(got) != 2 || filepath.Base(got[0]) != "a.pcap" || filepath.Base(got[1]) != "b.pcap" {
		t.Errorf("Files = %q", got)
	}
	t.Setenv(Env, filepath.Join(d, "a.pcap"))
	if _, err := Dir(); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("file: %v", err)
	}
}

// TestDirWalk: without the variable, the directory is ../shared/golden
// beside the module root above the working directory.
func TestDirWalk(t *testing.T) {
	t.Setenv(Env, "")
	root := t.TempDir()
	mod := filepath.Join(root, "main")
	pkg := filepath.Join(mod, "a", "b")
	g := filepath.Join(root, "shared", "golden")
	for _, d := range []string{pkg, g} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(pkg)
	if _, err := Dir(); err == nil || !strings.Contains(err.Error(), g) {
		t.Errorf("no captures: %v, want it to name %s", err, g)
	}
	if err := os.WriteFile(filepath.Join(g, "x.pcap"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Dir(); err != nil || got != g {
		t.Errorf("Dir() = %q, %v; want %q", got, err, g)
	}
}
