//go:build linux

// Command vmagent is /init of the interop lab's VM. It mounts the pseudo
// file systems, loads the kernel modules listed in /etc/rocev2lab/modules,
// configures eth0 from the kernel command line (rocev2lab.ip=ADDR/PREFIX,
// rocev2lab.mtu=N, rocev2lab.ipv6=1 for its link-local IPv6 address),
// creates the soft-RoCE device rxe0 on eth0, waits for its RoCEv2 IPv4 GID
// (and with IPv6 its link-local one), prints agentproto.ReadyPrefix on the console and then
// serves the command channel (agentproto) on TCP port agentproto.Port.
//
// It is built by the interop test (CGO_ENABLED=0) and never runs on the host.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

const (
	modulesFile = "/etc/rocev2lab/modules"
	rxeDev      = "rxe0"
	netDev      = "eth0"
)

var start = time.Now()

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "vmagent[%.2fs]: %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

// fatal reports a boot failure on the console and powers the VM off, so
// the host sees qemu exit and prints the console log.
func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "ROCEV2-LAB-FAILED: %s\n", fmt.Sprintf(format, args...))
	unix.Sync()
	if os.Getpid() == 1 {
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	os.Exit(1)
}

func main() {
	os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	os.Setenv("HOME", "/root")
	if os.Getpid() == 1 {
		mountAll()
	}
	params := cmdline()
	loadModules()
	ip := params["rocev2lab.ip"]
	if ip == "" {
		fatal("no rocev2lab.ip= on the kernel command line")
	}
	mtu := params["rocev2lab.mtu"]
	if mtu == "" {
		mtu = "1500"
	}
	ipv6 := params["rocev2lab.ipv6"] == "1"
	configureNet(ip, mtu, ipv6)
	idx, gid := createRXE()
	gid6 := ""
	if ipv6 {
		i6, g6 := waitGID("fe80:0000:0000:0000:", "IPv6 link-local")
		gid6 = fmt.Sprintf(" gid6_index=%d gid6=%s", i6, g6)
	}
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(agentproto.Port))
	if err != nil {
		fatal("listen on TCP %d: %v", agentproto.Port, err)
	}
	var up float64
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		up, _ = strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	}
	fmt.Fprintf(os.Stdout, "%s ip=%s gid_index=%d gid=%s%s uptime=%.2f agent=%.2f\n",
		agentproto.ReadyPrefix, strings.Split(ip, "/")[0], idx, gid, gid6, up, time.Since(start).Seconds())
	for {
		c, err := ln.Accept()
		if err != nil {
			logf("accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go serve(c)
	}
}

func mountAll() {
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"devpts", "/dev/pts", "devpts"},
		{"tmpfs", "/tmp", "tmpfs"},
		{"tmpfs", "/run", "tmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			logf("mount %s: %v", m.dst, err)
		}
	}
}

// cmdline returns the key=value words of /proc/cmdline.
func cmdline() map[string]string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		fatal("read /proc/cmdline: %v", err)
	}
	m := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}

// loadModules loads every module of modulesFile in order (dependencies first).
func loadModules() {
	var uts unix.Utsname
	unix.Uname(&uts)
	rel := unix.ByteSliceToString(uts.Release[:])
	b, err := os.ReadFile(modulesFile)
	if err != nil {
		fatal("read %s: %v", modulesFile, err)
	}
	for _, m := range strings.Fields(string(b)) {
		p := filepath.Join("/lib/modules", rel, m)
		f, err := os.Open(p)
		if err != nil {
			fatal("module %s: %v", m, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			fatal("load module %s: %v", m, err)
		}
	}
}

// run runs a setup command and fails the boot if it fails.
func run(name string, args ...string) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		fatal("%s %s: %v: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
}

func writeFile(p, v string) {
	if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
		logf("write %s: %v", p, err)
	}
}

// configureNet sets up eth0: ip, mtu and, with ipv6, its link-local IPv6
// address (EUI-64 of its MAC, no DAD, no router solicitations: the address
// is usable at once and the wire stays quiet); without ipv6, IPv6 is off.
func configureNet(ip, mtu string, ipv6 bool) {
	v6 := map[bool]string{true: "0", false: "1"}[ipv6]
	writeFile("/proc/sys/net/ipv6/conf/all/disable_ipv6", v6)
	writeFile("/proc/sys/net/ipv6/conf/default/disable_ipv6", v6)
	for _, c := range []string{"all", "default"} {
		writeFile("/proc/sys/net/ipv6/conf/"+c+"/accept_dad", "0")
		writeFile("/proc/sys/net/ipv6/conf/"+c+"/router_solicitations", "0")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat("/sys/class/net/" + netDev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			fatal("no %s after 10 s (virtio_net not loaded?)", netDev)
		}
		time.Sleep(20 * time.Millisecond)
	}
	writeFile("/proc/sys/net/ipv6/conf/"+netDev+"/disable_ipv6", v6)
	writeFile("/proc/sys/net/ipv6/conf/"+netDev+"/accept_dad", "0")
	writeFile("/proc/sys/net/ipv6/conf/"+netDev+"/router_solicitations", "0")
	run("ip", "link", "set", "lo", "up")
	run("ip", "link", "set", netDev, "mtu", mtu, "up")
	run("ip", "addr", "add", ip, "dev", netDev)
}

// createRXE adds rxe0 on eth0 and waits for its RoCEv2 IPv4-mapped GID.
func createRXE() (int, string) {
	run("rdma", "link", "add", rxeDev, "type", "rxe", "netdev", netDev)
	return waitGID("0000:0000:0000:0000:0000:ffff:", "IPv4")
}

// waitGID waits for a RoCEv2 GID of rxe0 starting with prefix (sysfs
// form) and returns its index and value.
func waitGID(prefix, what string) (int, string) {
	dir := "/sys/class/infiniband/" + rxeDev + "/ports/1"
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(dir + "/gids")
		for _, e := range ents {
			g, err := os.ReadFile(dir + "/gids/" + e.Name())
			if err != nil {
				continue
			}
			t, _ := os.ReadFile(dir + "/gid_attrs/types/" + e.Name())
			gs := strings.TrimSpace(string(g))
			if strings.HasPrefix(gs, prefix) && strings.TrimSpace(string(t)) == "RoCE v2" {
				n, _ := strconv.Atoi(e.Name())
				return n, gs
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	fatal("%s has no RoCEv2 %s GID after 20 s", rxeDev, what)
	return 0, ""
}

// serve handles one command-channel connection.
func serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	line, err := r.ReadBytes('\n')
	if err != nil {
		return
	}
	var req agentproto.Request
	var resp agentproto.Response
	if err := json.Unmarshal(line, &req); err != nil {
		resp = agentproto.Response{Exit: -1, Err: "bad request: " + err.Error()}
	} else {
		// The peer closing the connection cancels the command.
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			var b [1]byte
			c.Read(b[:])
			cancel()
		}()
		resp = handle(ctx, &req)
		cancel()
	}
	b, _ := json.Marshal(&resp)
	c.Write(append(b, '\n'))
}

func handle(ctx context.Context, req *agentproto.Request) agentproto.Response {
	t0 := time.Now()
	tmo := time.Duration(req.TimeoutSec * float64(time.Second))
	if tmo <= 0 {
		tmo = 300 * time.Second
	}
	if req.WaitListen > 0 {
		deadline := t0.Add(tmo)
		for {
			if listening(req.WaitListen) {
				return agentproto.Response{Seconds: time.Since(t0).Seconds()}
			}
			if time.Now().After(deadline) {
				return agentproto.Response{Exit: -1, TimedOut: true, Seconds: time.Since(t0).Seconds(),
					Err: fmt.Sprintf("nothing listens on TCP port %d after %v", req.WaitListen, tmo)}
			}
			select {
			case <-ctx.Done():
				return agentproto.Response{Exit: -1, Err: "cancelled"}
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	cmd := exec.Command("/bin/sh", "-c", req.Cmd)
	cmd.Dir = "/root"
	out := &limitedBuffer{max: agentproto.MaxOutput}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return agentproto.Response{Exit: -1, Err: "start: " + err.Error()}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(tmo)
	defer timer.Stop()
	resp := agentproto.Response{}
	var err error
	select {
	case err = <-done:
	case <-timer.C:
		resp.TimedOut = true
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		err = <-done
	case <-ctx.Done():
		unix.Kill(-cmd.Process.Pid, unix.SIGKILL)
		err = <-done
		resp.Err = "cancelled"
	}
	resp.Output = out.String()
	resp.Seconds = time.Since(t0).Seconds()
	resp.Exit = cmd.ProcessState.ExitCode()
	if err != nil && resp.Exit == 0 {
		resp.Exit = -1
		resp.Err = err.Error()
	}
	return resp
}

// listening reports whether a TCP socket (IPv4 or IPv6) listens on port.
func listening(port int) bool {
	want := fmt.Sprintf(":%04X ", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			fs := strings.Fields(l)
			// sl local_address rem_address st ...; st 0A = LISTEN
			if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1]+" ", want) {
				return true
			}
		}
	}
	return false
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
