//go:build linux

package share_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// dropCaps removes CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN from the
// calling thread's effective and permitted sets (capabilities are per
// thread; the caller keeps the goroutine on it with runtime.LockOSThread).
func dropCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var d [2]unix.CapUserData
	if err := unix.Capget(&hdr, &d[0]); err != nil {
		return err
	}
	for _, c := range []int{unix.CAP_BPF, unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN} {
		d[c/32].Effective &^= 1 << (c % 32)
		d[c/32].Permitted &^= 1 << (c % 32)
		d[c/32].Inheritable &^= 1 << (c % 32)
	}
	return unix.Capset(&hdr, &d[0])
}

// childNoCaps opens CHILD_ADDR without the capabilities: with ShareOn it
// must fail at once naming them; with ShareAuto it must either open the
// address unshared (nobody shares it) or fail with EADDRINUSE naming them
// (a group holds it). It prints one line per attempt.
func childNoCaps() int {
	runtime.LockOSThread()
	if err := dropCaps(); err != nil {
		fmt.Println("FAIL capset:", err)
		return 1
	}
	addr := netip.MustParseAddr(os.Getenv("CHILD_ADDR"))
	start := time.Now()
	_, err := udp.ListenSocket(addr, &udp.SocketOptions{Share: udp.ShareOn})
	fmt.Printf("ON %v %d %s\n", errors.Is(err, share.ErrCapability), time.Since(start).Milliseconds(), strings.ReplaceAll(fmt.Sprint(err), "\n", " "))
	l, err := udp.ListenSocket(addr, &udp.SocketOptions{})
	if err == nil {
		fmt.Printf("AUTO ok shared=%v\n", l.Shared())
		l.Close()
	} else {
		fmt.Printf("AUTO %v %s\n", errors.Is(err, syscall.EADDRINUSE), strings.ReplaceAll(err.Error(), "\n", " "))
	}
	return 0
}

func runNoCaps(t testing.TB, addr netip.Addr) (on, auto string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=nocaps", "CHILD_ADDR="+addr.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("child output %q", out)
	}
	return lines[0], lines[1]
}

// TestUnprivileged: without CAP_BPF/CAP_NET_ADMIN a shared open fails at
// once with an error naming them and the alternative; the default opens
// the address unshared, or, when a group holds it, fails without joining
// (so it never receives another process's packets).
func TestUnprivileged(t *testing.T) {
	needRoot(t)
	a := testAddrs(3)
	free, held := a[0], a[2]
	on, auto := runNoCaps(t, free)
	t.Log(on)
	t.Log(auto)
	f := strings.Fields(on)
	if len(f) < 3 || f[1] != "true" {
		t.Errorf("ShareOn without capabilities: %q, want an error matching share.ErrCapability", on)
	}
	if ms, _ := time.ParseDuration(f[2] + "ms"); ms > time.Second {
		t.Errorf("the error took %v", ms)
	}
	for _, want := range []string{"CAP_BPF", "CAP_NET_ADMIN", "own IP address", "--share=false"} {
		if !strings.Contains(on, want) {
			t.Errorf("error %q does not name %q", on, want)
		}
	}
	if auto != "AUTO ok shared=false" {
		t.Errorf("default open without capabilities: %q, want an unshared link", auto)
	}

	// A group holds the address: the unprivileged default open fails
	// (EADDRINUSE, naming the capabilities) instead of joining it.
	l, err := udp.ListenSocket(held, &udp.SocketOptions{Share: udp.ShareOn})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		l.Close()
		share.Remove(netip.AddrPortFrom(held, udp.Port), "")
	}()
	_, auto = runNoCaps(t, held)
	t.Log(auto)
	if !strings.HasPrefix(auto, "AUTO true") || !strings.Contains(auto, "CAP_BPF") {
		t.Errorf("default open of a shared address without capabilities: %q, want EADDRINUSE naming CAP_BPF", auto)
	}
}
