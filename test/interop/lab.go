//go:build linux

package interop

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// Addresses of the lab (TEST-NET-1, inside the lab's own network namespace).
const (
	HostIP   = "192.0.2.1" // the bridge in the namespace; rocev2d binds here
	VMIP     = "192.0.2.2" // the VM's eth0 and rxe0
	Prefix   = 24
	VMMAC    = "52:54:00:c0:02:02"
	HostMAC  = "52:54:00:c0:02:01" // the bridge's
	Bridge   = "rv2br0"
	Tap      = "rv2tap0"
	VMDev    = "eth0" // the VM's NIC (virtio-net), rxe0's netdev
	nsPrefix = "rocev2-interop-"
)

// IPv6 of the lab: link-local only (the modified EUI-64 of each side's
// MAC, fe80::/64, no DAD), so every address needs its zone: HostLL%rv2br0
// on the host, VMLL%eth0 in the VM. rxe0 lists VMLL as a RoCEv2 GID
// (Lab.GID6Index).
const (
	HostLL = "fe80::5054:ff:fec0:201"
	VMLL   = "fe80::5054:ff:fec0:202"
)

// Wire MTUs: the netdev MTU of the tap, the bridge and the VM's eth0.
// rxe's active MTU follows the netdev (1500 -> 1024, 9000 -> 4096).
const (
	DefaultWireMTU = 1500
	JumboWireMTU   = 9000
)

// Lab is one running VM with rxe0, in a network namespace of its own.
type Lab struct {
	// NS is the network namespace name; HostCommand runs programs in it.
	NS string
	// Dir holds the console log, captures and outputs of this run.
	Dir string
	// GIDIndex is rxe0's RoCEv2 IPv4 GID index; GID6Index its RoCEv2
	// GID of the link-local VMLL.
	GIDIndex, GID6Index int
	// WireMTU is the wire's current netdev MTU (SetWireMTU).
	WireMTU int
	// BootTime is the time from qemu start to an answering command channel.
	BootTime time.Duration

	img     *Image
	logf    func(string, ...any)
	qemu    *exec.Cmd
	qemuErr chan error
	reboots int // Reboot's count
	console string
	pidFile string

	mu    sync.Mutex
	procs map[int]*exec.Cmd // host processes started in the namespace, by PID

	// vm, when its name is set, is one VM of several sharing a namespace
	// (vmpair.go); the zero value is the single VM of StartLab.
	vm vmSpec
}

// vmSpec describes one VM of a lab: its qemu name, eth0 address and MAC,
// the tap it is wired to, and whether the namespace belongs to someone
// else (then Close leaves it). The zero value is StartLab's single VM.
type vmSpec struct {
	name, ip, mac, tap string
	sharedNS           bool
}

func (l *Lab) vmIP() string  { return cmp.Or(l.vm.ip, VMIP) }
func (l *Lab) vmMAC() string { return cmp.Or(l.vm.mac, VMMAC) }
func (l *Lab) vmTap() string { return cmp.Or(l.vm.tap, Tap) }

// StartLab creates the network namespace (bridge HostIP/24 + tap), boots the
// VM and waits until rxe0 is up and the agent answers. On failure the error
// carries the tail of the VM console. The caller must Close the lab.
func StartLab(ctx context.Context, img *Image, dir string, logf func(string, ...any)) (*Lab, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cleanStaleVMs(filepath.Dir(dir), logf)
	cleanStaleNamespaces(logf)
	l := &Lab{NS: nsPrefix + strconv.Itoa(os.Getpid()), Dir: dir, img: img, logf: logf,
		console: filepath.Join(dir, "console.log"), procs: map[int]*exec.Cmd{}, WireMTU: DefaultWireMTU, GID6Index: -1}
	t0 := time.Now()
	if err := l.netns(); err != nil {
		l.Close()
		return nil, err
	}
	if err := l.boot(ctx); err != nil {
		l.Close()
		return nil, err
	}
	l.BootTime = time.Since(t0)
	return l, nil
}

// cleanStaleVMs ends the processes of earlier runs whose test process is
// gone (killed before its cleanup could run): each run keeps
// stateDir/lab-TESTPID.pid with one "PID CMDLINE-HASH" line per process it
// started (qemu, tcpdump, rocev2d); a process is killed only if its command
// line is still the recorded one.
func cleanStaleVMs(stateDir string, logf func(string, ...any)) {
	files, _ := filepath.Glob(filepath.Join(stateDir, "lab-*.pid"))
	for _, f := range files {
		// lab-PID.pid, or lab-PID.VMNAME.pid for a VM of a pair.
		ownerStr, _, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "lab-"), ".pid"), ".")
		owner, err := strconv.Atoi(ownerStr)
		if err != nil || unix.Kill(owner, 0) == nil {
			continue
		}
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n") {
			var pid int
			var sum string
			if _, err := fmt.Sscanf(line, "%d %s", &pid, &sum); err != nil || pid <= 1 {
				continue
			}
			if cmdlineHash(pid) == sum {
				unix.Kill(pid, unix.SIGKILL)
				logf("lab: killed pid %d left by test process %d", pid, owner)
			}
		}
		os.Remove(f)
	}
}

// cmdlineHash identifies a process by its command line ("" if it is gone).
func cmdlineHash(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return ""
	}
	return hashBytes(b)
}

func hashBytes(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// execHash is the command-line hash a process started as
// "ip netns exec NS prog args..." has once ip has exec'd prog.
func execHash(c *exec.Cmd) string {
	args := c.Args
	if len(args) > 4 && args[0] == "ip" && args[1] == "netns" && args[2] == "exec" {
		args = args[4:]
	}
	return hashBytes([]byte(strings.Join(args, "\x00") + "\x00"))
}

// savePIDs records the running processes for cleanStaleVMs.
func (l *Lab) savePIDs() {
	if l.pidFile == "" {
		return
	}
	var b strings.Builder
	if l.qemu != nil {
		fmt.Fprintf(&b, "%d %s\n", l.qemu.Process.Pid, execHash(l.qemu))
	}
	for pid, c := range l.procs {
		fmt.Fprintf(&b, "%d %s\n", pid, execHash(c))
	}
	os.WriteFile(l.pidFile, []byte(b.String()), 0o644)
}

// cleanStaleNamespaces deletes namespaces of earlier runs whose process is
// gone (a run killed before its cleanup).
func cleanStaleNamespaces(logf func(string, ...any)) {
	for _, ns := range netns.RemoveStale(strings.TrimSuffix(nsPrefix, "-")) {
		logf("lab: deleted stale namespace %s", ns)
	}
}

// netns creates the namespace, the bridge with HostIP and HostLL (MAC
// HostMAC) and the VM's tap. IPv6 is on but quiet: no DAD, no router
// solicitations, no address on the tap (a bridge port), no multicast
// snooping (neighbour discovery is flooded).
func (l *Lab) netns() error {
	cmds := [][]string{
		{"ip", "netns", "add", l.NS},
		{"ip", "-n", l.NS, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", l.NS, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
			"net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
			"net.ipv6.conf.all.router_solicitations=0", "net.ipv6.conf.default.router_solicitations=0"},
		{"ip", "-n", l.NS, "link", "add", Bridge, "address", HostMAC, "type", "bridge",
			"stp_state", "0", "forward_delay", "0", "mcast_snooping", "0"},
		{"ip", "-n", l.NS, "link", "set", Bridge, "addrgenmode", "none"},
		{"ip", "-n", l.NS, "addr", "add", HostIP + "/" + strconv.Itoa(Prefix), "dev", Bridge},
		{"ip", "-n", l.NS, "addr", "add", HostLL + "/64", "dev", Bridge, "nodad"},
		{"ip", "-n", l.NS, "link", "set", Bridge, "mtu", strconv.Itoa(DefaultWireMTU), "up"},
		{"ip", "-n", l.NS, "tuntap", "add", "dev", Tap, "mode", "tap"},
		{"ip", "netns", "exec", l.NS, "sysctl", "-q", "-w", "net.ipv6.conf." + Tap + ".disable_ipv6=1"},
		{"ip", "-n", l.NS, "link", "set", Tap, "mtu", strconv.Itoa(DefaultWireMTU), "master", Bridge, "up"},
	}
	for _, c := range cmds {
		if _, err := runCmd(nil, c[0], c[1:]...); err != nil {
			return fmt.Errorf("lab network: %w", err)
		}
	}
	return nil
}

// HostCommand returns a command that runs name in the lab's namespace.
func (l *Lab) HostCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", l.NS, name}, args...)...)
	// The lab's rocev2d processes keep their connection journal
	// (rdmacm.JournalEnv) in the lab's directory: a killed one's
	// restart speaks for it, and no other run's records meet them.
	c.Env = append(os.Environ(), "ROCEV2_CM_JOURNAL="+filepath.Join(l.Dir, "cm-journal"))
	// ip netns exec execs name, so the PID is the program's; SIGTERM first.
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = 5 * time.Second
	return c
}

// track records a started host process so Close can end it by PID.
func (l *Lab) track(c *exec.Cmd) {
	l.mu.Lock()
	l.procs[c.Process.Pid] = c
	l.savePIDs()
	l.mu.Unlock()
}

func (l *Lab) untrack(c *exec.Cmd) {
	l.mu.Lock()
	delete(l.procs, c.Process.Pid)
	l.savePIDs()
	l.mu.Unlock()
}

// consoleLogLevel is the guest kernel's console log level: 4 (errors and
// worse) unless ROCEV2_INTEROP_LOGLEVEL says otherwise (0-8; 8 sends
// every kernel message to the console file, for a chase of a guest
// problem).
func consoleLogLevel() string {
	if s := os.Getenv("ROCEV2_INTEROP_LOGLEVEL"); len(s) == 1 && s[0] >= '0' && s[0] <= '8' {
		return s
	}
	return "4"
}

// boot starts qemu in the namespace and waits for the agent.
func (l *Lab) boot(ctx context.Context) error {
	args := []string{
		"-name", cmp.Or(l.vm.name, "rocev2-interop"), "-accel", "tcg", "-cpu", "max", "-smp", "1", "-m", "1024",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", l.img.Kernel, "-initrd", l.img.Initrd,
		// nokaslr: the same kernel addresses in every boot (guestcpu.go).
		"-append", fmt.Sprintf("console=ttyS0 panic=-1 quiet nokaslr loglevel=%s rocev2lab.ip=%s/%d rocev2lab.mtu=%d rocev2lab.ipv6=1", consoleLogLevel(), l.vmIP(), Prefix, DefaultWireMTU),
		"-chardev", "file,id=con0,path=" + l.console, "-serial", "chardev:con0",
		"-qmp", "unix:" + l.qmpPath() + ",server=on,wait=off",
		"-netdev", "tap,id=net0,ifname=" + l.vmTap() + ",script=no,downscript=no",
		"-device", "virtio-net-pci,netdev=net0,mac=" + l.vmMAC(),
	}
	os.Remove(l.qmpPath())
	qlog, err := os.Create(filepath.Join(l.Dir, "qemu.log"))
	if err != nil {
		return err
	}
	// qemu truncates the console file only once it runs: an old ready
	// line from an earlier boot in the same directory must not be read
	// before that.
	if err := os.WriteFile(l.console, nil, 0o644); err != nil {
		qlog.Close()
		return err
	}
	defer qlog.Close()
	c := exec.Command("ip", append([]string{"netns", "exec", l.NS, "qemu-system-x86_64"}, args...)...)
	c.Stdout, c.Stderr = qlog, qlog
	if err := c.Start(); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	l.qemu = c
	l.pidFile = filepath.Join(filepath.Dir(l.Dir), fmt.Sprintf("lab-%d.pid", os.Getpid()))
	if l.vm.name != "" {
		l.pidFile = filepath.Join(filepath.Dir(l.Dir), fmt.Sprintf("lab-%d.%s.pid", os.Getpid(), l.vm.name))
	}
	l.mu.Lock()
	l.savePIDs()
	l.mu.Unlock()
	l.qemuErr = make(chan error, 1)
	go func() { l.qemuErr <- c.Wait() }()
	l.logf("lab: qemu pid %d, console %s", c.Process.Pid, l.console)

	deadline := time.Now().Add(bootTimeout())
	for {
		b, _ := os.ReadFile(l.console)
		// The ready line counts once it is whole: the console file can
		// hold its first bytes only (a CI-like run read a bare
		// "ROCEV2-LAB-READY", took GID index 0 and failed 110 cells).
		if i := bytes.Index(b, []byte(agentproto.ReadyPrefix)); i >= 0 && bytes.IndexByte(b[i:], '\n') >= 0 {
			line, _, _ := strings.Cut(string(b[i:]), "\n")
			l.logf("lab: %s", strings.TrimSpace(line))
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "gid_index="); ok {
					l.GIDIndex, _ = strconv.Atoi(v)
				}
				if v, ok := strings.CutPrefix(f, "gid6_index="); ok {
					l.GID6Index, _ = strconv.Atoi(v)
				}
			}
			break
		}
		if bytes.Contains(b, []byte("ROCEV2-LAB-FAILED")) || bytes.Contains(b, []byte("Kernel panic")) {
			return l.bootErr("VM setup failed")
		}
		select {
		case err := <-l.qemuErr:
			l.qemuErr <- err
			return l.bootErr(fmt.Sprintf("qemu exited (%v)", err))
		case <-ctx.Done():
			return l.bootErr(ctx.Err().Error())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return l.bootErr(fmt.Sprintf("no %s after %v", agentproto.ReadyPrefix, bootTimeout()))
		}
	}
	// The agent listens before it prints the ready line; check it answers.
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r, err := l.Run(rctx, "uname -r; ibv_devices", 20*time.Second)
	if err != nil || r.Exit != 0 {
		return l.bootErr(fmt.Sprintf("command channel: %v %s", err, r.Output))
	}
	l.logf("lab: VM answers: %s", strings.Join(strings.Fields(r.Output), " "))
	return nil
}

func bootTimeout() time.Duration {
	if s := os.Getenv("ROCEV2_INTEROP_BOOT_TIMEOUT"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			return d
		}
	}
	return 180 * time.Second
}

// Console returns the last n lines of the VM console.
func (l *Lab) Console(n int) string {
	b, _ := os.ReadFile(l.console)
	return tail(string(b), n)
}

func (l *Lab) bootErr(why string) error {
	q, _ := os.ReadFile(filepath.Join(l.Dir, "qemu.log"))
	return fmt.Errorf("VM boot failed: %s\n--- qemu output:\n%s\n--- VM console (last 60 lines of %s):\n%s",
		why, tail(string(q), 20), l.console, l.Console(60))
}

// Reboot stops the VM (its qemu, by PID) and boots it again in the same
// namespace: for a guest that stopped answering (the rxe 6.1 guest has,
// with no console message, after a client's QP kept resending to a
// killed peer and after nvmet's port removal), so that the cells after
// it do not all fail on a dead VM. The old console is kept beside the
// new one (console-N.log). The caller says it loudly.
func (l *Lab) Reboot(ctx context.Context) error {
	l.stopQemu("for a reboot")
	l.reboots++
	if b, err := os.ReadFile(l.console); err == nil {
		os.WriteFile(strings.TrimSuffix(l.console, ".log")+fmt.Sprintf("-%d.log", l.reboots), b, 0o644)
	}
	t0 := time.Now()
	if err := l.boot(ctx); err != nil {
		return err
	}
	l.logf("lab: VM rebooted in %.1fs (reboot %d)", time.Since(t0).Seconds(), l.reboots)
	return nil
}

// stopQemu stops the VM's qemu (SIGTERM, then SIGKILL after 5 s) and
// reports whether one was running; why goes into the log line.
func (l *Lab) stopQemu(why string) bool {
	if l.qemu == nil {
		return false
	}
	l.qemu.Process.Signal(syscall.SIGTERM)
	select {
	case <-l.qemuErr:
	case <-time.After(5 * time.Second):
		l.qemu.Process.Kill()
		<-l.qemuErr
	}
	l.logf("lab: qemu pid %d stopped %s", l.qemu.Process.Pid, why)
	l.qemu = nil
	return true
}

// Reboots returns how many times Reboot booted the VM again.
func (l *Lab) Reboots() int { return l.reboots }

// Close stops every process the lab started (by PID: host programs, then
// qemu) and deletes the namespace.
func (l *Lab) Close() {
	l.mu.Lock()
	procs := make([]*exec.Cmd, 0, len(l.procs))
	for _, c := range l.procs {
		procs = append(procs, c)
	}
	l.mu.Unlock()
	for _, c := range procs {
		c.Process.Signal(syscall.SIGTERM)
	}
	if l.stopQemu("") {
		os.Remove(l.pidFile)
	}
	if _, err := os.Stat("/run/netns/" + l.NS); err == nil && !l.vm.sharedNS {
		if _, err := runCmd(nil, "ip", "netns", "del", l.NS); err != nil {
			l.logf("lab: %v", err)
		}
	}
}

// InNS runs f on an OS thread that joined the lab's network namespace.
// Sockets f creates stay in the namespace after it returns; everything else
// (goroutines f starts, later syscalls) runs in the host namespace as usual.
func (l *Lab) InNS(f func() error) error {
	return netns.Do(l.NS, f)
}

// dialNS opens a TCP connection from inside the lab's namespace.
func (l *Lab) dialNS(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := l.InNS(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// ConsoleTail returns the last n lines of the VM's console (kernel
// messages: a soft lockup, an oops or a hung task shows there).
func (l *Lab) ConsoleTail(n int) string {
	b, err := os.ReadFile(l.console)
	if err != nil {
		return fmt.Sprintf("(console: %v)", err)
	}
	return lastLinesOf(string(b), n)
}

func lastLinesOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// VMCmd is a command running in the VM.
type VMCmd struct {
	conn net.Conn
	res  chan vmResult
}

type vmResult struct {
	r   agentproto.Response
	err error
}

// StartVM starts cmd (sh -c) in the VM. Wait returns its result; Cancel
// kills it.
func (l *Lab) StartVM(ctx context.Context, req agentproto.Request) (*VMCmd, error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := l.dialNS(dctx, net.JoinHostPort(l.vmIP(), strconv.Itoa(agentproto.Port)))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("command channel %s:%d: %w", l.vmIP(), agentproto.Port, err)
	}
	b, _ := json.Marshal(&req)
	if _, err := conn.Write(append(b, '\n')); err != nil {
		conn.Close()
		return nil, err
	}
	v := &VMCmd{conn: conn, res: make(chan vmResult, 1)}
	go func() {
		var r agentproto.Response
		line, err := bufio.NewReaderSize(conn, 1<<20).ReadBytes('\n')
		if err == nil {
			err = json.Unmarshal(line, &r)
		} else if errors.Is(err, io.EOF) {
			err = errors.New("agent closed the connection without a result (VM crashed?)")
		}
		v.res <- vmResult{r, err}
	}()
	return v, nil
}

// Wait waits for the command's result.
func (v *VMCmd) Wait(ctx context.Context) (agentproto.Response, error) {
	select {
	case r := <-v.res:
		v.conn.Close()
		return r.r, r.err
	case <-ctx.Done():
		v.conn.Close()
		return agentproto.Response{Exit: -1}, ctx.Err()
	}
}

// Cancel kills the command in the VM (closing the channel kills its process
// group) and returns what it printed.
func (v *VMCmd) Cancel() (agentproto.Response, error) {
	if tc, ok := v.conn.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return v.Wait(ctx)
}

// Run runs cmd in the VM and returns its result.
func (l *Lab) Run(ctx context.Context, cmd string, timeout time.Duration) (agentproto.Response, error) {
	v, err := l.StartVM(ctx, agentproto.Request{Cmd: cmd, TimeoutSec: timeout.Seconds()})
	if err != nil {
		return agentproto.Response{Exit: -1}, err
	}
	return v.Wait(ctx)
}

// WaitListenVM waits until a TCP port listens in the VM.
func (l *Lab) WaitListenVM(ctx context.Context, port int, timeout time.Duration) error {
	v, err := l.StartVM(ctx, agentproto.Request{WaitListen: port, TimeoutSec: timeout.Seconds()})
	if err != nil {
		return err
	}
	r, err := v.Wait(ctx)
	if err != nil {
		return err
	}
	if r.Err != "" {
		return errors.New(r.Err)
	}
	return nil
}

// Counters reads rxe0's port counters (hw_counters) in the VM.
func (l *Lab) Counters(ctx context.Context) (map[string]uint64, error) {
	r, err := l.Run(ctx, "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *", 20*time.Second)
	if err != nil {
		return nil, err
	}
	if r.Exit != 0 {
		return nil, fmt.Errorf("reading hw_counters: exit %d: %s", r.Exit, r.Output)
	}
	m := map[string]uint64{}
	for _, l := range strings.Split(r.Output, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, nil
}

// SetWireMTU sets the netdev MTU of the whole wire — the tap and the
// bridge in the namespace, eth0 in the VM — unless it is already mtu, and
// waits until rxe0's active MTU follows (rxe takes the largest IB MTU
// that fits: 1500 -> 1024, 9000 -> 4096). It is done within the running
// VM (rxe reacts to NETDEV_CHANGEMTU), so the cells at either MTU share
// one boot. A larger MTU is raised on the host first, a smaller one
// lowered in the VM first, so no side sends what the other would drop.
func (l *Lab) SetWireMTU(ctx context.Context, mtu int) error {
	if mtu == 0 {
		mtu = DefaultWireMTU
	}
	if mtu == l.WireMTU {
		return nil
	}
	t0 := time.Now()
	host := func() error {
		for _, dev := range []string{Tap, Bridge} {
			if _, err := runCmd(nil, "ip", "-n", l.NS, "link", "set", dev, "mtu", strconv.Itoa(mtu)); err != nil {
				return fmt.Errorf("wire MTU %d: %w", mtu, err)
			}
		}
		return nil
	}
	want := rxeActiveMTU(mtu)
	vm := func() error {
		// ibv_devinfo prints "active_mtu: 4096 (5)".
		cmd := fmt.Sprintf("ip link set %s mtu %d && for i in $(seq 100); do ibv_devinfo -d rxe0 | grep -q 'active_mtu:[[:space:]]*%d ' && exit 0; sleep 0.05; done; ibv_devinfo -d rxe0; exit 1",
			VMDev, mtu, want)
		r, err := l.Run(ctx, cmd, 20*time.Second)
		if err != nil || r.Exit != 0 {
			return fmt.Errorf("wire MTU %d in the VM (rxe0 active_mtu %d expected): %v %s", mtu, want, err, r.Output)
		}
		return nil
	}
	order := []func() error{host, vm}
	if mtu < l.WireMTU {
		order = []func() error{vm, host}
	}
	for _, f := range order {
		if err := f(); err != nil {
			return err
		}
	}
	l.logf("lab: wire MTU %d -> %d, rxe0 active_mtu %d (%.1fs)", l.WireMTU, mtu, want, time.Since(t0).Seconds())
	l.WireMTU = mtu
	return nil
}

// rxeActiveMTU is the IB MTU rxe derives from a netdev MTU: the largest of
// 256..4096 that fits in it less RXE_MAX_HDR_LENGTH (80) bytes of headers
// (rxe_param.h eth_mtu_int_to_enum).
func rxeActiveMTU(netdev int) int {
	room := netdev - 80
	for _, m := range []int{4096, 2048, 1024, 512, 256} {
		if room >= m {
			return m
		}
	}
	return 256
}

// HostProc is a program running in the lab namespace on the host.
type HostProc struct {
	Cmd    *exec.Cmd
	out    bytes.Buffer
	mu     sync.Mutex
	done   chan struct{}
	err    error
	lab    *Lab
	Output func() string
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// StartHost starts name in the namespace, collecting stdout and stderr.
func (l *Lab) StartHost(ctx context.Context, name string, args ...string) (*HostProc, error) {
	h := &HostProc{Cmd: l.HostCommand(ctx, name, args...), done: make(chan struct{}), lab: l}
	w := lockedWriter{&h.mu, &h.out}
	h.Cmd.Stdout, h.Cmd.Stderr = w, w
	if err := h.Cmd.Start(); err != nil {
		return nil, err
	}
	l.track(h.Cmd)
	h.Output = func() string {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.out.String()
	}
	go func() {
		h.err = h.Cmd.Wait()
		l.untrack(h.Cmd)
		close(h.done)
	}()
	return h, nil
}

// Wait waits for the program and returns its exit status (-1 if it did
// not exit normally) and output.
func (h *HostProc) Wait() (int, string) {
	<-h.done
	return h.Cmd.ProcessState.ExitCode(), h.Output()
}

// Done is closed when the program has exited.
func (h *HostProc) Done() <-chan struct{} { return h.done }

// WaitListen waits until the program listens on TCP port (it reads the
// program's own view of /proc/PID/net/tcp, so nothing connects to it).
func (h *HostProc) WaitListen(port int, timeout time.Duration) error {
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(timeout)
	for {
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", h.Cmd.Process.Pid, f))
			for _, line := range strings.Split(string(b), "\n") {
				fs := strings.Fields(line)
				if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1]+" ", want) {
					return nil
				}
			}
		}
		select {
		case <-h.done:
			return fmt.Errorf("exited before listening on TCP %d:\n%s", port, h.Output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening on TCP %d after %v", port, timeout)
		}
	}
}

// Capture is a running tcpdump on the tap (the host side of the VM's wire).
type Capture struct {
	File string
	h    *HostProc
}

// StartCapture starts tcpdump on the tap writing file (everything except
// the command channel) and waits until it captures.
func (l *Lab) StartCapture(ctx context.Context, file string) (*Capture, error) {
	return l.StartCaptureOn(ctx, Tap, file)
}

// StartCaptureOn is StartCapture on the namespace's interface ifname: on
// the Bridge it sees the VM's packets after the tap's ingress hook (those
// the fault injector let through) and the host's before its egress hook.
func (l *Lab) StartCaptureOn(ctx context.Context, ifname, file string) (*Capture, error) {
	// Snap length 9216, not 0: in immediate mode libpcap uses fixed ring
	// slots of the snap length, so -s 0 (256 KiB slots) left a 32 MiB ring
	// only ~128 frames deep and tcpdump dropped packets in the bursts of a
	// go-back-N under loss. The tap's MTU is 1500: no RoCEv2 frame is cut.
	h, err := l.StartHost(ctx, "tcpdump", "-i", ifname, "-s", "9216", "-U", "--immediate-mode", "-B", "65536", "-n", "-Z", "root", "-w", file,
		"not", "tcp", "port", strconv.Itoa(agentproto.Port))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.Output(), "listening on") {
		select {
		case <-h.done:
			return nil, fmt.Errorf("tcpdump exited: %s", h.Output())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.Cmd.Process.Signal(syscall.SIGTERM)
			return nil, fmt.Errorf("tcpdump not capturing after 10 s: %s", h.Output())
		}
	}
	return &Capture{File: file, h: h}, nil
}

// Stop ends the capture (SIGTERM flushes the file) and returns tcpdump's
// own summary ("N packets captured ...").
func (c *Capture) Stop() string {
	time.Sleep(100 * time.Millisecond) // let the last frames reach the file
	c.h.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.h.done:
	case <-time.After(5 * time.Second):
		c.h.Cmd.Process.Kill()
		<-c.h.done
	}
	return strings.TrimSpace(c.h.Output())
}
