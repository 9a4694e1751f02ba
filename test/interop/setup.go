//go:build linux

package interop

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Packages are the Debian packages the lab needs on the host. The VM's
// userspace (tools, libraries, busybox) is copied from the host, so the
// tools in the VM are exactly the host's Debian versions.
var Packages = []string{
	"qemu-system-x86", "rdma-core", "ibverbs-utils", "ibverbs-providers", "perftest",
	"rdmacm-utils", "busybox-static", "tcpdump", "kmod", "cpio", "iproute2",
	"gcc", "libc6-dev", "libibverbs-dev", // to build vmtools/rv2imm.c
	"nvme-cli", // nvme (with libnvme) against rocev2d nvmf-target (nvmf_cli_test.go)
}

// VMModules are the kernel modules the VM loads (with their dependencies,
// found from each module's .modinfo "depends"). Names a kernel builds in
// are skipped.
var VMModules = []string{"virtio_pci", "virtio_net", "crc32_generic", "rdma_rxe", "rdma_ucm", "ib_umad",
	// NVMe over Fabrics (nvmf_lab_test.go): the host (nvme-rdma, with
	// nvme-core and nvme-fabrics), the target (nvmet-rdma, nvmet,
	// configfs) with a memory block device (null_blk), and ext4 for a
	// filesystem on a namespace (busybox mke2fs makes ext2, which ext4
	// mounts; ext4 wants the crc32c driver, which it only loads by name).
	"nvme_rdma", "nvmet_rdma", "null_blk", "ext4", "crc32c_generic"}

// VMTools are the host binaries copied into the VM (with their libraries).
// Optional ones are skipped when the host lacks them.
var VMTools = []struct {
	Name     string
	Optional bool
}{
	{Name: "ibv_devices"}, {Name: "ibv_devinfo"}, {Name: "ibv_rc_pingpong"}, {Name: "ibv_uc_pingpong"},
	{Name: "ibv_ud_pingpong"}, {Name: "ibv_srq_pingpong"},
	{Name: "ib_write_bw"}, {Name: "ib_write_lat"}, {Name: "ib_read_bw"}, {Name: "ib_read_lat"},
	{Name: "ib_send_bw"}, {Name: "ib_send_lat"}, {Name: "ib_atomic_bw"}, {Name: "ib_atomic_lat"},
	{Name: "rping"}, {Name: "rdma_server"}, {Name: "rdma_client"}, {Name: "udaddy"}, {Name: "cmtime"}, {Name: "ucmatose"}, {Name: "rdma"}, {Name: "tcpdump", Optional: true},
	{Name: "nvme"},
}

// Config says where the lab keeps its files and how to report progress.
type Config struct {
	// CacheDir holds the kernel, the built binaries, the initramfs and the
	// run directories. Default $ROCEV2_INTEROP_CACHE or /tmp/rocev2-interop.
	CacheDir string
	// RepoRoot is the module root (the directory holding go.mod).
	RepoRoot string
	// KernelPackage pins the Debian kernel package
	// (default $ROCEV2_INTEROP_KPKG, else what linux-image-amd64 depends on).
	KernelPackage string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
}

func (c *Config) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

// Image is what Prepare produces.
type Image struct {
	KernelVersion string
	Kernel        string // bzImage path
	Initrd        string // gzip'ed cpio path
	Rocev2d       string // host-side rocev2d binary
	// Timings of the preparation steps, in order.
	Timings []Timing
}

// Timing is the duration of one named step.
type Timing struct {
	Step string
	D    time.Duration
}

// DefaultCacheDir returns $ROCEV2_INTEROP_CACHE or /tmp/rocev2-interop.
func DefaultCacheDir() string {
	if d := os.Getenv("ROCEV2_INTEROP_CACHE"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "rocev2-interop")
}

// FindRepoRoot walks up from dir to the directory holding go.mod.
func FindRepoRoot(dir string) (string, error) {
	d, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", fmt.Errorf("no go.mod above %s", dir)
		}
		d = p
	}
}

// Prepare installs the missing packages, fetches and unpacks the kernel
// (once per kernel version), builds the VM agent and rocev2d and writes the
// initramfs. It is idempotent and takes a few seconds when everything is
// already in place.
func Prepare(cfg Config) (*Image, error) {
	if cfg.CacheDir == "" {
		cfg.CacheDir = DefaultCacheDir()
	}
	if cfg.KernelPackage == "" {
		cfg.KernelPackage = os.Getenv("ROCEV2_INTEROP_KPKG")
	}
	if err := os.MkdirAll(filepath.Join(cfg.CacheDir, "build"), 0o755); err != nil {
		return nil, err
	}
	img := &Image{}
	step := func(name string, f func() error) error {
		t := time.Now()
		err := f()
		img.Timings = append(img.Timings, Timing{name, time.Since(t)})
		cfg.logf("setup: %-10s %6.1fs%s", name, time.Since(t).Seconds(), map[bool]string{true: "", false: "  FAILED"}[err == nil])
		if err != nil {
			return fmt.Errorf("setup %s: %w", name, err)
		}
		return nil
	}
	var agent, imm string
	var mods []string
	var kdir string
	if err := step("packages", func() error { return installPackages(&cfg) }); err != nil {
		return nil, err
	}
	if err := step("kernel", func() (err error) {
		kdir, mods, err = fetchKernel(&cfg, img)
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("go build", func() (err error) {
		agent = filepath.Join(cfg.CacheDir, "build", "vmagent")
		img.Rocev2d = filepath.Join(cfg.CacheDir, "build", "rocev2d")
		if err = goBuild(cfg.RepoRoot, agent, "./test/interop/vmagent", true); err != nil {
			return err
		}
		return goBuild(cfg.RepoRoot, img.Rocev2d, "./cmd/rocev2d", false)
	}); err != nil {
		return nil, err
	}
	if err := step("gcc", func() error {
		imm = filepath.Join(cfg.CacheDir, "build", "rv2imm")
		_, err := runCmd(nil, "gcc", "-O2", "-Wall", "-o", imm, filepath.Join(cfg.RepoRoot, "test/interop/vmtools/rv2imm.c"), "-libverbs")
		return err
	}); err != nil {
		return nil, err
	}
	if err := step("initramfs", func() error {
		return buildInitramfs(&cfg, img, kdir, mods, agent, imm)
	}); err != nil {
		return nil, err
	}
	return img, nil
}

// runCmd runs a command and returns its combined output, with the output in
// the error when it fails.
func runCmd(env []string, name string, args ...string) ([]byte, error) {
	c := exec.Command(name, args...)
	if env != nil {
		c.Env = append(os.Environ(), env...)
	}
	out, err := c.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(string(out), 40))
	}
	return out, nil
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// installPackages apt-get installs the packages that dpkg does not list as
// installed (one apt-get update + install when something is missing).
func installPackages(cfg *Config) error {
	var missing []string
	for _, p := range Packages {
		out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || !strings.Contains(string(out), "install ok installed") {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("packages %v are missing and installing them needs root", missing)
	}
	cfg.logf("setup: apt-get install %s", strings.Join(missing, " "))
	env := []string{"DEBIAN_FRONTEND=noninteractive"}
	if _, err := runCmd(env, "apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-q"); err != nil {
		return err
	}
	args := append([]string{"-o", "DPkg::Lock::Timeout=600", "install", "-y", "-q", "--no-install-recommends"}, missing...)
	_, err := runCmd(env, "apt-get", args...)
	return err
}

// resolveKernelPackage returns the versioned kernel package name
// (linux-image-6.1.0-N-amd64) that linux-image-amd64 depends on.
func resolveKernelPackage(cfg *Config) (string, error) {
	if cfg.KernelPackage != "" {
		return cfg.KernelPackage, nil
	}
	find := func() string {
		out, _ := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") && f[1] != "linux-image-amd64" {
				return f[1]
			}
		}
		return ""
	}
	if p := find(); p != "" {
		return p, nil
	}
	if _, err := runCmd(nil, "apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-q"); err != nil {
		return "", err
	}
	if p := find(); p != "" {
		return p, nil
	}
	return "", errors.New("apt-cache cannot resolve linux-image-amd64 (set ROCEV2_INTEROP_KPKG=linux-image-...)")
}

// fetchKernel makes sure CacheDir/kernel-KVER holds vmlinuz and the needed
// modules (dependency order in "modules.load"); it downloads and unpacks
// the Debian package only when that directory is missing or was made for a
// different module list. It returns the directory and the module list.
func fetchKernel(cfg *Config, img *Image) (string, []string, error) {
	pkg, err := resolveKernelPackage(cfg)
	if err != nil {
		return "", nil, err
	}
	kver := strings.TrimPrefix(pkg, "linux-image-")
	img.KernelVersion = kver
	kdir := filepath.Join(cfg.CacheDir, "kernel-"+kver)
	img.Kernel = filepath.Join(kdir, "vmlinuz")
	stamp := strings.Join(VMModules, " ")
	if b, err := os.ReadFile(filepath.Join(kdir, ".done")); err == nil && string(b) == stamp {
		b, err := os.ReadFile(filepath.Join(kdir, "modules.load"))
		if err == nil {
			return kdir, strings.Fields(string(b)), nil
		}
	}
	debs := filepath.Join(cfg.CacheDir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", nil, err
	}
	deb, _ := filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
	if len(deb) == 0 {
		cfg.logf("setup: apt-get download %s", pkg)
		c := exec.Command("apt-get", "-o", "APT::Sandbox::User=root", "download", "-q", pkg)
		c.Dir = debs
		if out, err := c.CombinedOutput(); err != nil {
			return "", nil, fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, tail(string(out), 20))
		}
		deb, _ = filepath.Glob(filepath.Join(debs, pkg+"_*.deb"))
		if len(deb) == 0 {
			return "", nil, fmt.Errorf("apt-get download %s left no .deb in %s", pkg, debs)
		}
	}
	x, err := os.MkdirTemp(cfg.CacheDir, "kernel-extract-")
	if err != nil {
		return "", nil, err
	}
	defer os.RemoveAll(x)
	if _, err := runCmd(nil, "dpkg-deb", "-x", deb[0], x); err != nil {
		return "", nil, err
	}
	root := filepath.Join(x, "lib", "modules", kver)
	cfgFile, _ := os.ReadFile(filepath.Join(x, "boot", "config-"+kver))
	if !bytes.Contains(cfgFile, []byte("\nCONFIG_RDMA_RXE=m")) && !bytes.Contains(cfgFile, []byte("\nCONFIG_RDMA_RXE=y")) {
		return "", nil, fmt.Errorf("%s: kernel config has no CONFIG_RDMA_RXE", pkg)
	}
	builtin, _ := os.ReadFile(filepath.Join(root, "modules.builtin"))
	order, err := resolveModules(root, VMModules, string(builtin))
	if err != nil {
		return "", nil, err
	}
	tmp := kdir + ".tmp"
	os.RemoveAll(tmp)
	for _, m := range order {
		b, err := os.ReadFile(filepath.Join(root, m))
		if err != nil {
			return "", nil, err
		}
		if err := writeFileAll(filepath.Join(tmp, "modules", m), b, 0o644); err != nil {
			return "", nil, err
		}
	}
	k, err := os.ReadFile(filepath.Join(x, "boot", "vmlinuz-"+kver))
	if err != nil {
		return "", nil, err
	}
	if err := writeFileAll(filepath.Join(tmp, "vmlinuz"), k, 0o644); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "modules.load"), []byte(strings.Join(order, "\n")+"\n"), 0o644); err != nil {
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".done"), []byte(stamp), 0o644); err != nil {
		return "", nil, err
	}
	os.RemoveAll(kdir)
	if err := os.Rename(tmp, kdir); err != nil {
		return "", nil, err
	}
	os.Remove(deb[0]) // 70 MB; the kernel directory is all that is needed now
	return kdir, order, nil
}

func writeFileAll(p string, b []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	return os.WriteFile(p, b, perm)
}

// modName normalises a module name: '-' and '_' are the same to the kernel.
func modName(s string) string {
	s = filepath.Base(s)
	s = strings.TrimSuffix(s, ".xz")
	s = strings.TrimSuffix(s, ".zst")
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// modDepends reads the "depends=" field of a module's .modinfo section.
func modDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s := f.Section(".modinfo")
	if s == nil {
		return nil, fmt.Errorf("%s: no .modinfo section", path)
	}
	b, err := s.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// resolveModules returns the module files (relative to root) that load the
// wanted modules, dependencies first. Modules listed in builtin
// (modules.builtin contents) are skipped.
func resolveModules(root string, want []string, builtin string) ([]string, error) {
	index := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.Contains(d.Name(), ".ko") {
			rel, _ := filepath.Rel(root, p)
			index[modName(d.Name())] = rel
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	built := map[string]bool{}
	for _, l := range strings.Fields(builtin) {
		built[modName(l)] = true
	}
	return orderModules(want, func(name string) (string, []string, error) {
		if built[name] {
			return "", nil, nil
		}
		rel, ok := index[name]
		if !ok {
			return "", nil, fmt.Errorf("module %s: not in %s and not built in", name, root)
		}
		deps, err := modDepends(filepath.Join(root, rel))
		return rel, deps, err
	})
}

// orderModules does a depth-first walk over lookup(name) = (file, deps)
// and returns the files in load order. An empty file means built in.
func orderModules(want []string, lookup func(string) (string, []string, error)) ([]string, error) {
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string, []string) error
	visit = func(n string, path []string) error {
		n = modName(n)
		switch state[n] {
		case 1:
			return fmt.Errorf("module dependency cycle: %s -> %s", strings.Join(path, " -> "), n)
		case 2:
			return nil
		}
		state[n] = 1
		file, deps, err := lookup(n)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if d == "" {
				continue
			}
			if err := visit(d, append(path, n)); err != nil {
				return err
			}
		}
		state[n] = 2
		if file != "" {
			order = append(order, file)
		}
		return nil
	}
	for _, w := range want {
		if err := visit(w, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// goBuild builds pkg (relative to the repo root) into out.
func goBuild(repo, out, pkg string, static bool) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	c := exec.Command(goBin, "build", "-trimpath", "-o", out, pkg)
	c.Dir = repo
	c.Env = os.Environ()
	if static {
		c.Env = append(c.Env, "CGO_ENABLED=0")
	}
	if b, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// libDirs are searched for shared libraries, in order.
var libDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// elfDeps returns the shared libraries bin needs (recursively, as real
// file paths) and its program interpreter.
func elfDeps(bins ...string) (libs map[string]string, interp string, err error) {
	libs = map[string]string{} // soname -> path
	var walk func(p string) error
	walk = func(p string) error {
		f, err := elf.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		for _, prog := range f.Progs {
			if prog.Type == elf.PT_INTERP {
				b := make([]byte, prog.Filesz)
				if _, err := prog.ReadAt(b, 0); err == nil {
					interp = strings.TrimRight(string(b), "\x00")
				}
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		for _, n := range needed {
			if _, ok := libs[n]; ok {
				continue
			}
			found := ""
			for _, d := range libDirs {
				if _, err := os.Stat(filepath.Join(d, n)); err == nil {
					found = filepath.Join(d, n)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s: not found in %v", p, n, libDirs)
			}
			libs[n] = found
			if err := walk(found); err != nil {
				return err
			}
		}
		return nil
	}
	for _, b := range bins {
		if err := walk(b); err != nil {
			return nil, "", err
		}
	}
	return libs, interp, nil
}

// buildInitramfs writes the VM's initramfs: the agent as /init, busybox
// with its applets, the tools with their libraries and the rxe provider,
// and the modules.
func buildInitramfs(cfg *Config, img *Image, kdir string, mods []string, agent string, extra ...string) error {
	a := NewArchive()
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "root", "etc", "var/run"} {
		a.Dir(d, 0o755)
	}
	a.Dir("tmp", 0o1777)
	a.CharDev("dev/console", 0o600, 5, 1)
	a.CharDev("dev/null", 0o666, 1, 3)
	add := func(dst, src string, perm uint32) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		a.File(dst, perm, b)
		return nil
	}
	if err := add("init", agent, 0o755); err != nil {
		return err
	}
	// Modules, at lib/modules/KVER/<rel>, and the load order for the agent.
	for _, m := range mods {
		if err := add(filepath.Join("lib/modules", img.KernelVersion, m), filepath.Join(kdir, "modules", m), 0o644); err != nil {
			return err
		}
	}
	a.File("etc/rocev2lab/modules", 0o644, []byte(strings.Join(mods, "\n")+"\n"))
	// busybox and its applets (real tools copied below replace links).
	bb, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox-static not installed: %w", err)
	}
	if f, err := elf.Open(bb); err == nil {
		libs, _ := f.ImportedLibraries()
		f.Close()
		if len(libs) > 0 {
			return fmt.Errorf("%s is dynamically linked; install busybox-static", bb)
		}
	}
	if err := add("bin/busybox", bb, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(bb, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("busybox --list-full: %w", err)
	}
	var links []string
	for _, l := range strings.Fields(string(out)) {
		links = append(links, l)
	}
	// Tools and their libraries.
	var bins []string
	for _, t := range VMTools {
		p, err := exec.LookPath(t.Name)
		if err != nil {
			if t.Optional {
				continue
			}
			return fmt.Errorf("tool %s not found (packages %v installed?)", t.Name, Packages)
		}
		rp, err := filepath.EvalSymlinks(p)
		if err != nil {
			return err
		}
		if err := add("usr/bin/"+t.Name, rp, 0o755); err != nil {
			return err
		}
		bins = append(bins, rp)
	}
	for _, e := range extra {
		if err := add("usr/bin/"+filepath.Base(e), e, 0o755); err != nil {
			return err
		}
		bins = append(bins, e)
	}
	provs, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so")
	if len(provs) == 0 {
		return errors.New("rxe provider librxe-rdmav*.so not found (ibverbs-providers installed?)")
	}
	for _, p := range provs {
		if err := add(strings.TrimPrefix(p, "/"), p, 0o644); err != nil {
			return err
		}
		bins = append(bins, p)
	}
	if err := add("etc/libibverbs.d/rxe.driver", "/etc/libibverbs.d/rxe.driver", 0o644); err != nil {
		return err
	}
	libs, interp, err := elfDeps(bins...)
	if err != nil {
		return err
	}
	// glibc dlopen()s libgcc_s for thread cancellation (rping).
	if _, err := os.Stat("/lib/x86_64-linux-gnu/libgcc_s.so.1"); err == nil {
		libs["libgcc_s.so.1"] = "/lib/x86_64-linux-gnu/libgcc_s.so.1"
	}
	names := make([]string, 0, len(libs))
	for n := range libs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if err := add("lib/x86_64-linux-gnu/"+n, libs[n], 0o755); err != nil {
			return err
		}
	}
	if interp != "" {
		if err := add(interp, interp, 0o755); err != nil {
			return err
		}
	}
	for _, l := range links {
		a.Symlink(l, "/bin/busybox")
	}
	a.File("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\ntcpdump:x:104:104::/nonexistent:/bin/false\n"))
	a.File("etc/group", 0o644, []byte("root:x:0:\ntcpdump:x:104:\n"))
	a.File("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n"+HostIP+" host\n"+VMIP+" vm\n"))
	a.File("etc/nsswitch.conf", 0o644, []byte("hosts: files\nservices: files\nprotocols: files\n"))
	for _, f := range []string{"/etc/services", "/etc/protocols"} {
		if _, err := os.Stat(f); err == nil {
			add(f, f, 0o644)
		}
	}

	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if _, err := a.WriteTo(zw); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	sum := sha256.Sum256(buf.Bytes())
	img.Initrd = filepath.Join(cfg.CacheDir, "build", "initramfs-"+hex.EncodeToString(sum[:6])+".cpio.gz")
	if _, err := os.Stat(img.Initrd); err == nil {
		return nil
	}
	old, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "build", "initramfs-*.cpio.gz"))
	for _, o := range old {
		os.Remove(o)
	}
	cfg.logf("setup: initramfs %d entries, %.1f MB", a.Len(), float64(buf.Len())/1e6)
	return os.WriteFile(img.Initrd, buf.Bytes(), 0o644)
}
