//go:build linux

package interop

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The two VMs of a VMPair: vm0 and vm1 on one bridge (rv2br0, HostIP) in
// the lab namespace, each on a tap of its own, each with rxe0 on eth0.
var pairSpecs = [2]vmSpec{
	{name: "vm0", ip: "192.0.2.10", mac: "52:54:00:c0:02:0a", tap: "rv2tap0", sharedNS: true},
	{name: "vm1", ip: "192.0.2.11", mac: "52:54:00:c0:02:0b", tap: "rv2tap1", sharedNS: true},
}

// VMPair is two 1-vCPU VMs of the lab (vm0, vm1) on one bridge, booted
// from an image that also carries a static rocev2d (PairImage), so that
// rxe ↔ rxe and rocev2d ↔ rocev2d run between the same two VMs in one
// boot (vm_bench_test.go).
type VMPair struct {
	// NS is the shared network namespace; Dir the run directory (vm0/
	// and vm1/ hold each VM's console and qemu output).
	NS, Dir string
	// VM are the two VMs; VM[i].Run and StartVM reach each one's agent.
	VM [2]*Lab
	// IP are the VMs' eth0 addresses.
	IP [2]string
	// BootTime is the time from the namespace to both agents answering.
	BootTime time.Duration
	logf     func(string, ...any)
}

// PairImage returns img with an initramfs that also holds
// /usr/bin/rocev2d and /usr/bin/udpping (vmtools/udpping, the raw UDP
// ping-pong), /usr/bin/dio (vmtools/dio, O_DIRECT block load) and /usr/bin/icrc.test (package icrc's tests and
// benchmarks), built static (CGO_ENABLED=0) from the repository: a
// second gzip'ed cpio archive appended to img.Initrd, which the kernel
// unpacks over the first. The file is cached by content in
// cfg.CacheDir/build. With alt, the root of another checkout of the
// module, its rocev2d is added as /usr/bin/rocev2d-alt, so that two
// versions can be compared in one boot.
func PairImage(cfg Config, img *Image, alt string) (*Image, error) {
	if cfg.CacheDir == "" {
		cfg.CacheDir = DefaultCacheDir()
	}
	a := NewArchive()
	type tool struct{ name, root, pkg string }
	tools := []tool{
		{"rocev2d", cfg.RepoRoot, "./cmd/rocev2d"},
		{"udpping", cfg.RepoRoot, "./test/interop/vmtools/udpping"},
		{"dio", cfg.RepoRoot, "./test/interop/vmtools/dio"}, // O_DIRECT load for BenchmarkVMNvmf
		{"icrc.test", cfg.RepoRoot, "./icrc"},               // its benchmarks: the ICRC's cost on the VM's CPU
	}
	if alt != "" {
		tools = append(tools, tool{"rocev2d-alt", alt, "./cmd/rocev2d"})
	}
	for _, b := range tools {
		bin := filepath.Join(cfg.CacheDir, "build", b.name+"-static")
		build := goBuild
		if strings.HasSuffix(b.name, ".test") {
			build = goTestBuild
		}
		if err := build(b.root, bin, b.pkg, true); err != nil {
			return nil, err
		}
		rb, err := os.ReadFile(bin)
		if err != nil {
			return nil, err
		}
		a.File("usr/bin/"+b.name, 0o755, rb)
	}
	var extra bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&extra, gzip.BestSpeed)
	if _, err := a.WriteTo(zw); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	base, err := os.ReadFile(img.Initrd)
	if err != nil {
		return nil, err
	}
	// The kernel takes concatenated archives; each member starts on a
	// 4-byte boundary (zero padding between members is skipped).
	for len(base)%4 != 0 {
		base = append(base, 0)
	}
	all := append(base, extra.Bytes()...)
	sum := sha256.Sum256(all)
	out := *img
	out.Initrd = filepath.Join(cfg.CacheDir, "build", "initramfs-pair-"+hex.EncodeToString(sum[:6])+".cpio.gz")
	if _, err := os.Stat(out.Initrd); err == nil {
		return &out, nil
	}
	old, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "build", "initramfs-pair-*.cpio.gz"))
	for _, o := range old {
		os.Remove(o)
	}
	cfg.logf("setup: pair initramfs %.1f MB (rocev2d, udpping, dio and icrc.test: %.1f MB appended)", float64(len(all))/1e6, float64(extra.Len())/1e6)
	return &out, os.WriteFile(out.Initrd, all, 0o644)
}

// goTestBuild builds pkg's test binary into out, as goBuild builds a
// command.
func goTestBuild(repo, out, pkg string, static bool) error {
	c := exec.Command("go", "test", "-c", "-trimpath", "-o", out, pkg)
	c.Dir = repo
	c.Env = os.Environ()
	if static {
		c.Env = append(c.Env, "CGO_ENABLED=0")
	}
	if b, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("go test -c %s: %w\n%s", pkg, err, b)
	}
	return nil
}

// StartVMPair creates the namespace (bridge with HostIP, taps rv2tap0 and
// rv2tap1) and boots vm0 and vm1 at once; it returns when both agents
// answer. The caller must Close the pair.
func StartVMPair(ctx context.Context, img *Image, dir string, logf func(string, ...any)) (*VMPair, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cleanStaleVMs(filepath.Dir(dir), logf)
	cleanStaleNamespaces(logf)
	p := &VMPair{NS: nsPrefix + strconv.Itoa(os.Getpid()) + "-pair", Dir: dir, logf: logf}
	t0 := time.Now()
	if err := p.netns(); err != nil {
		p.Close()
		return nil, err
	}
	for i, s := range pairSpecs {
		vdir := filepath.Join(dir, s.name)
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			p.Close()
			return nil, err
		}
		p.IP[i] = s.ip
		name := s.name
		p.VM[i] = &Lab{NS: p.NS, Dir: vdir, img: img, console: filepath.Join(vdir, "console.log"),
			procs: map[int]*exec.Cmd{}, WireMTU: DefaultWireMTU, GID6Index: -1, vm: s,
			logf: func(f string, a ...any) { logf(name+": "+f, a...) }}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range p.VM {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.VM[i].boot(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		p.Close()
		return nil, err
	}
	p.BootTime = time.Since(t0)
	return p, nil
}

// netns creates the pair's namespace: the bridge as StartLab's (HostIP,
// quiet IPv6) with one tap per VM.
func (p *VMPair) netns() error {
	cmds := [][]string{
		{"ip", "netns", "add", p.NS},
		{"ip", "-n", p.NS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", p.NS, "sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
			"net.ipv6.conf.all.router_solicitations=0", "net.ipv6.conf.default.router_solicitations=0"},
		{"ip", "-n", p.NS, "link", "add", Bridge, "address", HostMAC, "type", "bridge",
			"stp_state", "0", "forward_delay", "0", "mcast_snooping", "0"},
		{"ip", "-n", p.NS, "link", "set", Bridge, "addrgenmode", "none"},
		{"ip", "-n", p.NS, "addr", "add", HostIP + "/" + strconv.Itoa(Prefix), "dev", Bridge},
		{"ip", "-n", p.NS, "link", "set", Bridge, "mtu", strconv.Itoa(DefaultWireMTU), "up"},
	}
	for _, s := range pairSpecs {
		cmds = append(cmds,
			[]string{"ip", "-n", p.NS, "tuntap", "add", "dev", s.tap, "mode", "tap"},
			[]string{"ip", "netns", "exec", p.NS, "sysctl", "-q", "-w", "net.ipv6.conf." + s.tap + ".disable_ipv6=1"},
			[]string{"ip", "-n", p.NS, "link", "set", s.tap, "mtu", strconv.Itoa(DefaultWireMTU), "master", Bridge, "up"})
	}
	for _, c := range cmds {
		if _, err := runCmd(nil, c[0], c[1:]...); err != nil {
			return fmt.Errorf("pair network: %w", err)
		}
	}
	return nil
}

// Close stops both VMs (each Lab.Close ends its qemu by PID) and deletes
// the namespace.
func (p *VMPair) Close() {
	var wg sync.WaitGroup
	for _, l := range p.VM {
		if l != nil {
			wg.Add(1)
			go func() { defer wg.Done(); l.Close() }()
		}
	}
	wg.Wait()
	if _, err := os.Stat("/run/netns/" + p.NS); err == nil {
		if _, err := runCmd(nil, "ip", "netns", "del", p.NS); err != nil {
			p.logf("pair: %v", err)
		}
	}
}
