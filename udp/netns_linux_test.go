//go:build linux

package udp

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

// skipUnlessNetns skips the test loudly when network namespaces cannot be
// made here (not root, no iproute2) — or fails it when CI=true, where the
// veth tests must run.
func skipUnlessNetns(t testing.TB) {
	t.Helper()
	why := ""
	if os.Geteuid() != 0 {
		why = "network namespaces and veth pairs need root"
	} else if _, err := exec.LookPath("ip"); err != nil {
		why = "iproute2 'ip' is not installed"
	}
	if why == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true but %s", why)
	}
	t.Skipf("SKIPPED (veth/netns test): %s", why)
}

// netnsSeq numbers the namespace pairs of this process, so names stay
// unique when one test makes several.
var netnsSeq atomic.Uint32

// netnsPair is a veth pair between two network namespaces made by a test.
type netnsPair struct {
	NsA, NsB   string     // namespace names (in /var/run/netns)
	IfA, IfB   string     // the veth ends, IfA in NsA, IfB in NsB
	AddrA      netip.Addr // 198.51.100.1 on IfA
	AddrB      netip.Addr // 198.51.100.2 on IfB
	AddrAExtra netip.Addr // 198.51.100.3, a second address on IfA
}

// testNetnsPair creates two network namespaces joined by a veth pair,
// 198.51.100.1 (a) and 198.51.100.2 (b), and removes them at cleanup. It
// skips without root or iproute2 (fails with CI=true).
func testNetnsPair(t testing.TB) (nsA, nsB, ifA, ifB string) {
	p := newNetnsPair(t, 0)
	return p.NsA, p.NsB, p.IfA, p.IfB
}

// newNetnsPair is testNetnsPair with the veth MTU set (0 keeps 1500) and
// the extra address 198.51.100.3 on a's end. The namespaces are deleted by
// name at cleanup (which also removes the veth).
func newNetnsPair(t testing.TB, mtu int) *netnsPair {
	t.Helper()
	skipUnlessNetns(t)
	id := os.Getpid() % 100000
	n := netnsSeq.Add(1)
	p := &netnsPair{
		NsA: fmt.Sprintf("udptest-a-%d-%d", id, n), NsB: fmt.Sprintf("udptest-b-%d-%d", id, n),
		IfA: fmt.Sprintf("ua%dn%d", id, n), IfB: fmt.Sprintf("ub%dn%d", id, n),
		AddrA: netip.MustParseAddr("198.51.100.1"), AddrB: netip.MustParseAddr("198.51.100.2"),
		AddrAExtra: netip.MustParseAddr("198.51.100.3"),
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	run("netns", "add", p.NsA)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", p.NsA).Run() })
	run("netns", "add", p.NsB)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", p.NsB).Run() })
	run("link", "add", p.IfA, "netns", p.NsA, "type", "veth", "peer", "name", p.IfB, "netns", p.NsB)
	if mtu > 0 {
		run("-n", p.NsA, "link", "set", p.IfA, "mtu", fmt.Sprint(mtu))
		run("-n", p.NsB, "link", "set", p.IfB, "mtu", fmt.Sprint(mtu))
	}
	run("-n", p.NsA, "addr", "add", p.AddrA.String()+"/24", "dev", p.IfA)
	run("-n", p.NsA, "addr", "add", p.AddrAExtra.String()+"/24", "dev", p.IfA)
	run("-n", p.NsB, "addr", "add", p.AddrB.String()+"/24", "dev", p.IfB)
	run("-n", p.NsA, "link", "set", p.IfA, "up")
	run("-n", p.NsB, "link", "set", p.IfB, "up")
	return p
}

// inNetns runs f on an OS thread switched into the named namespace, so the
// sockets f creates belong to it.
func inNetns[T any](t testing.TB, ns string, f func() (T, error)) T {
	t.Helper()
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer orig.Close()
	target, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		t.Fatal(err)
	}
	v, ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err == nil {
		runtime.UnlockOSThread() // else the thread dies with the goroutine
	}
	if ferr != nil {
		t.Fatal(ferr)
	}
	return v
}

// TestGSOOnVethWire sends with UDP GSO through a veth that cannot segment
// (gso_max_segs 1, like a tap to a VM without USO), so the kernel segments
// in software and the peer sees separate datagrams. Captured on the peer,
// every segment must carry DF, identification = its index in the GSO
// datagram, and a valid ICRC over the real IP header — what rxe checks.
func TestGSOOnVethWire(t *testing.T) {
	nsA, nsB, ifA, ifB := testNetnsPair(t)
	if out, err := exec.Command("ip", "-n", nsA, "link", "set", ifA, "gso_max_segs", "1").CombinedOutput(); err != nil {
		t.Skipf("cannot set gso_max_segs: %v: %s", err, out)
	}
	src, dst := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	capFd := inNetns(t, nsB, func() (int, error) {
		ifi, err := net.InterfaceByName(ifB)
		if err != nil {
			return -1, err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return -1, err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return -1, err
		}
		tv := unix.Timeval{Usec: 100000}
		return fd, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	defer unix.Close(capFd)
	l := inNetns(t, nsA, func() (*SocketLink, error) { return ListenSocket(src, &SocketOptions{GSO: true}) })
	defer l.Close()

	// Resolve the neighbour first with one small packet.
	if err := l.Send([]Packet{{Buf: testPayload(make([]byte, 64), 999, 64), Addr: dst}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	var pkts []Packet
	for i := range 20 {
		size := 1024 + 28
		if i == 19 {
			size = 300
		}
		pkts = append(pkts, Packet{Buf: testPayload(make([]byte, size), uint32(i), size), Addr: dst, TOS: ECNECT0})
	}
	if err := l.Send(pkts); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	seen := 0
	for deadline := time.Now().Add(3 * time.Second); seen < len(pkts) && time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(capFd, buf, 0)
		if err != nil {
			continue
		}
		ip := buf[:n]
		if n < 28+minPacketSize || ip[0] != 0x45 || ip[9] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(ip[22:24]) != Port {
			continue
		}
		seq := seqOf(ip[28:])
		if seq == 999 {
			continue
		}
		if n-28 > 1100 {
			t.Fatalf("captured an unsegmented %d-byte datagram: the veth did segmentation offload", n-28)
		}
		if id := binary.BigEndian.Uint16(ip[4:6]); uint32(id) != seq {
			t.Errorf("segment %d: IPv4 ID %d, want %d", seq, id, seq)
		}
		if ff := binary.BigEndian.Uint16(ip[6:8]); ff != 0x4000 {
			t.Errorf("segment %d: flags %#04x, want DF", seq, ff)
		}
		if err := icrc.Verify(ip); err != nil {
			t.Errorf("segment %d: %v", seq, err)
		}
		seen++
	}
	if seen != len(pkts) {
		t.Fatalf("captured %d of %d segments", seen, len(pkts))
	}
}
