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

// TestDirWalk: without the variable, the directory is testdata/golden in
// the module root above the working directory.
func TestDirWalk(t *testing.T) {
	t.Setenv(Env, "")
	mod := t.TempDir()
	pkg := filepath.Join(mod, "a", "b")
	g := filepath.Join(mod, "testdata", "golden")
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

// moduleRoot is the directory holding this repository's go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			t.Fatalf("no go.mod above %s", wd)
		}
	}
}

// TestRepositoryHoldsGolden: the repository carries its captures. Without
// $ROCEV2_GOLDEN, Dir resolves inside the module root, and every capture
// INDEX.md lists is there with its .txt — a clone tests itself with
// nothing beside it.
func TestRepositoryHoldsGolden(t *testing.T) {
	t.Setenv(Env, "")
	root := moduleRoot(t)
	dir, err := Dir()
	if err != nil {
		t.Fatalf("Dir: %v", err)
	}
	if want := filepath.Join(root, "testdata", "golden"); dir != want {
		t.Fatalf("Dir() = %s, want %s (inside the repository)", dir, want)
	}
	index, err := os.ReadFile(filepath.Join(dir, "INDEX.md"))
	if err != nil {
		t.Fatal(err)
	}
	listed := 0
	for _, line := range strings.Split(string(index), "\n") {
		f := strings.Split(line, "|")
		if len(f) < 3 || !strings.HasSuffix(strings.TrimSpace(f[1]), ".pcap") {
			continue
		}
		name := strings.TrimSpace(f[1])
		listed++
		for _, n := range []string{name, strings.TrimSuffix(name, ".pcap") + ".txt"} {
			if st, err := os.Stat(filepath.Join(dir, n)); err != nil || st.Size() == 0 {
				t.Errorf("%s: listed in INDEX.md, missing or empty in %s (%v)", n, dir, err)
			}
		}
	}
	if got := len(Files(dir)); listed < 16 || got != listed {
		t.Errorf("INDEX.md lists %d captures, %s holds %d *.pcap", listed, dir, got)
	}
}

// TestNoOutsideReferences: no file of the repository points at the
// workspace directory beside the checkout that once held the captures
// (code, tests, scripts and docs alike).
func TestNoOutsideReferences(t *testing.T) {
	root := moduleRoot(t)
	bad := ".." + "/shared" // spelled apart so this file does not match itself
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n == ".git" || (p != root && strings.HasPrefix(n, ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".go", ".sh", ".md", ".txt", ".c", ".py", ".yml", ".yaml":
		default:
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, bad) {
				rel, _ := filepath.Rel(root, p)
				t.Errorf("%s:%d refers to %s: %s", rel, i+1, bad, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
