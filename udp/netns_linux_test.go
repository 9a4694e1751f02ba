//go:build linux

package udp

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/internal/netns"
)

// newNetnsPair creates two network namespaces joined by a veth pair with
// the given MTU (0 keeps 1500): 198.51.100.1 and 198.51.100.3 on a's end,
// 198.51.100.2 on b's; removed at cleanup. It skips without root or
// iproute2 (fails with CI=true).
func newNetnsPair(t testing.TB, mtu int) *netns.Pair {
	t.Helper()
	return netns.TestPair(t, netns.PairConfig{Prefix: "udptest", IfPrefix: "u",
		AddrA: netip.MustParseAddr("198.51.100.1"), AddrB: netip.MustParseAddr("198.51.100.2"),
		ExtraA: []netip.Addr{netip.MustParseAddr("198.51.100.3")}, MTU: mtu})
}

// TestGSOOnVethWire sends with UDP GSO through a veth that cannot segment
// (gso_max_segs 1, like a tap to a VM without USO), so the kernel segments
// in software and the peer sees separate datagrams. Captured on the peer,
// every segment must carry DF, identification = its index in the GSO
// datagram, and a valid ICRC over the real IP header — what rxe checks.
func TestGSOOnVethWire(t *testing.T) {
	np := newNetnsPair(t, 0)
	nsA, nsB, ifA, ifB := np.NsA, np.NsB, np.IfA, np.IfB
	if out, err := exec.Command("ip", "-n", nsA, "link", "set", ifA, "gso_max_segs", "1").CombinedOutput(); err != nil {
		t.Skipf("cannot set gso_max_segs: %v: %s", err, out)
	}
	src, dst := netip.MustParseAddr("198.51.100.1"), netip.MustParseAddr("198.51.100.2")
	capFd := netns.MustGet(t, nsB, func() (int, error) {
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
	l := netns.MustGet(t, nsA, func() (*SocketLink, error) { return ListenSocket(src, &SocketOptions{GSO: true}) })
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
