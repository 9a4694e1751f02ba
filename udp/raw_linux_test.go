//go:build linux

package udp

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

func TestRawSendRecv(t *testing.T) {
	a := listenRaw(t, sockA)
	b := listenRaw(t, sockB)
	const total = 150
	sizes := []int{16, 63, 1024 + 28, MaxPacketSize}
	ports := []uint16{0, 0xc144, 0xc121}
	pkts := make([]Packet, total)
	for i := range pkts {
		size := sizes[i%len(sizes)]
		pkts[i] = Packet{Buf: testPayload(make([]byte, size), uint32(i), size), Addr: sockB,
			SrcPort: ports[i%len(ports)], TOS: uint8(i % 4)}
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, total, 10*time.Second)
	for i, p := range got {
		wantPort := ports[i%len(ports)]
		if wantPort == 0 {
			wantPort = Port
		}
		if !bytes.Equal(p.Buf, pkts[i].Buf) || p.Addr != sockA || p.SrcPort != wantPort || p.TOS != uint8(i%4) {
			t.Fatalf("packet %d: len %d from %v:%d tos %d; want len %d from %v:%d tos %d",
				i, len(p.Buf), p.Addr, p.SrcPort, p.TOS, len(pkts[i].Buf), sockA, wantPort, i%4)
		}
	}
	if s := b.Stats(); s != (Stats{RcvdPkts: total}) {
		t.Errorf("receiver stats %+v", s)
	}
}

// TestRawInteropSocket: RawLink and SocketLink understand each other (same
// wire header: DF, ID 0).
func TestRawInteropSocket(t *testing.T) {
	r := listenRaw(t, sockA)
	s, err := ListenSocket(sockB, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Send([]Packet{{Buf: testPayload(make([]byte, 100), 1, 100), Addr: sockA}}); err != nil {
		t.Fatal(err)
	}
	if got := recvN(t, r, 1, 5*time.Second); seqOf(got[0].Buf) != 1 || got[0].SrcPort != s.SendPort() {
		t.Errorf("raw got seq %d port %d", seqOf(got[0].Buf), got[0].SrcPort)
	}
	if err := r.Send([]Packet{{Buf: testPayload(make([]byte, 100), 2, 100), Addr: sockB, SrcPort: 0xc555}}); err != nil {
		t.Fatal(err)
	}
	if got := recvN(t, s, 1, 5*time.Second); seqOf(got[0].Buf) != 2 || got[0].SrcPort != 0xc555 {
		t.Errorf("socket got seq %d port %d", seqOf(got[0].Buf), got[0].SrcPort)
	}
}

// TestRawVerifiesIPv4ID: a packet whose ICRC was computed for another IPv4
// identification passes a UDP socket's 16-bit check (SolveIPv4ID) but not
// RawLink's full one.
func TestRawVerifiesIPv4ID(t *testing.T) {
	b := listenRaw(t, sockB)
	plain, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// Like SocketLink: DF from an unconnected socket gets IPv4 ID 0.
	rc, err := plain.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	})
	if err != nil {
		t.Fatal(err)
	}
	lport := uint16(plain.LocalAddr().(*net.UDPAddr).Port)
	dst := &net.UDPAddr{IP: sockB.AsSlice(), Port: Port}
	mk := func(seq uint32, id uint16) []byte {
		p := testPayload(make([]byte, 64), seq, 64)
		h := icrc.IPv4Pseudo{Src: sockA.As4(), Dst: sockB.As4(), ID: id, FlagsFrag: 0x4000, SrcPort: lport, DstPort: Port}
		icrc.Store(p, icrc.ComputeIPv4(&h, p))
		return p
	}
	for _, g := range [][]byte{mk(1, 5), {1, 2, 3}, make([]byte, 40), mk(2, 0)} {
		if _, err := plain.WriteToUDP(g, dst); err != nil {
			t.Fatal(err)
		}
	}
	got := recvN(t, b, 1, 5*time.Second)
	if seqOf(got[0].Buf) != 2 || got[0].SrcPort != lport {
		t.Errorf("got seq %d from %d, want the ID-0 packet (seq 2) from %d", seqOf(got[0].Buf), got[0].SrcPort, lport)
	}
	if s := b.Stats(); s.DropBadICRC != 2 || s.DropMalformed != 1 || s.RcvdPkts != 1 {
		t.Errorf("stats %+v, want 2 bad ICRC (wrong ID, zeros), 1 malformed, 1 received", s)
	}
}

func TestRawErrorsAndClose(t *testing.T) {
	a := listenRaw(t, sockA)
	if _, err := ListenRaw(sockA, nil); !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), sockA.String()+":4791") {
		t.Errorf("second ListenRaw: %v, want EADDRINUSE naming the address", err)
	}
	if _, err := ListenRaw(netip.MustParseAddr("203.0.113.77"), nil); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("foreign address: %v, want EADDRNOTAVAIL", err)
	}
	if _, err := ListenRaw(netip.IPv6Loopback(), nil); !errors.Is(err, ErrAddress) {
		t.Errorf("IPv6: %v, want ErrAddress", err)
	}
	if err := a.Send([]Packet{{Buf: make([]byte, 64), Addr: netip.IPv6Loopback()}}); !errors.Is(err, ErrAddress) {
		t.Errorf("IPv6 destination: %v", err)
	}
	closeUnblocksRecv(t, a, recvBufs(2))
}

// BenchmarkRaw measures RawLink over loopback, 64 datagrams per call; compare
// with BenchmarkSocket in the same run.
func BenchmarkRaw(b *testing.B) {
	const batch = 64
	for _, size := range []int{1024, 4096} {
		b.Run(map[int]string{1024: "1KiB", 4096: "4KiB"}[size], func(b *testing.B) {
			benchLinks(b, listenRaw(b, sockA), listenRaw(b, sockB), testPackets(batch, size, sockB, 0xc000))
		})
	}
}

// FuzzRawAccept feeds arbitrary bytes to RawLink's IP packet check: it must
// never panic, and may only accept a well-formed IPv4/UDP/4791 packet whose
// ICRC verifies.
func FuzzRawAccept(f *testing.F) {
	good := make([]byte, 28+64)
	good[0], good[2], good[3], good[6], good[8], good[9] = 0x45, 0, byte(len(good)), 0x40, 64, 17
	copy(good[12:16], []byte{127, 47, 91, 1})
	copy(good[16:20], []byte{127, 47, 91, 2}) // the link's address
	good[20], good[21], good[22], good[23], good[25] = 0x12, 0xb7, 0x12, 0xb7, 72
	testPayload(good[28:], 1, 64)
	if err := icrc.Put(good); err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{0x45})
	f.Add(make([]byte, 60))
	f.Fuzz(func(t *testing.T, ip []byte) {
		l := &RawLink{}
		l.addr = netip.AddrFrom4([4]byte{127, 47, 91, 2})
		p := Packet{Buf: make([]byte, MaxPacketSize)}
		if l.acceptRaw(ip, &p) {
			if dst := netip.AddrFrom4([4]byte(ip[16:20])); dst != l.addr {
				t.Fatalf("accepted a packet to %v on a link on %v", dst, l.addr)
			}
			if err := icrc.Verify(ip); err != nil {
				t.Fatalf("accepted a packet that does not verify: %v", err)
			}
			if !bytes.Equal(p.Buf, ip[len(ip)-len(p.Buf):]) {
				t.Fatalf("payload is not the packet's tail")
			}
		}
		s := l.Stats()
		if s.DropBadICRC+s.DropMalformed+s.DropOther > 1 {
			t.Fatalf("one packet counted twice: %+v", s)
		}
	})
}

// TestRawSetupDropsForeign: a raw UDP socket receives every UDP datagram of
// the host from socket(2) until bind(2) narrows it to one address, and bind
// keeps what was queued. Under load other programs' RoCEv2 packets (valid
// ICRC, other addresses) got into that queue and RawLink returned them.
// setRawOptions must empty the queue and pass only addr:4791 afterwards.
func TestRawSetupDropsForeign(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
		t.Skipf("raw sockets need CAP_NET_RAW: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	a, b := listenPair(t)
	sockC := testLoopbackThird()
	c, err := ListenSocket(sockC, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send := func(seq uint32, dst netip.Addr) {
		t.Helper()
		if err := b.Send([]Packet{{Buf: testPayload(make([]byte, 64), seq, 64), Addr: dst}}); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, rawBufSize)
	// The premise: before bind the socket queues a datagram to sockC.
	send(1, sockC)
	recvN(t, c, 1, 5*time.Second) // raw sockets get a datagram before UDP does
	if _, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT); err != nil {
		t.Fatalf("unbound raw socket did not queue the datagram to %v: %v", sockC, err)
	}
	if err := setRawOptions(fd, sockA.As4(), &RawOptions{RecvBufferSize: 1 << 20, SendBufferSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: sockA.As4()}); err != nil {
		t.Fatal(err)
	}
	if n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != unix.EAGAIN {
		t.Fatalf("after setup the queue holds a datagram (%d bytes, err %v), want it empty", n, err)
	}
	send(2, sockC)
	send(3, sockA)
	recvN(t, c, 1, 5*time.Second)
	recvN(t, a, 1, 5*time.Second)
	n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT)
	if err != nil {
		t.Fatalf("datagram to %v not received: %v", sockA, err)
	}
	if ip := buf[:n]; n != 28+64 || netip.AddrFrom4([4]byte(ip[16:20])) != sockA || seqOf(ip[28:]) != 3 {
		t.Fatalf("received % x, want the datagram to %v with seq 3", ip[:min(n, 40)], sockA)
	}
	if n, _, err := unix.Recvfrom(fd, buf, unix.MSG_DONTWAIT); err != unix.EAGAIN {
		t.Fatalf("a second datagram (%d bytes, err %v) passed the filter", n, err)
	}
}

// TestRawSendReportsSrcPort: Send sets Packet.SrcPort to the port the
// packet left from — 4791 for SrcPort 0 — as the Link contract says (the
// pcap tap records that port).
func TestRawSendReportsSrcPort(t *testing.T) {
	a := listenRaw(t, sockA)
	b := listenRaw(t, sockB)
	pkts := testPackets(2, 100, sockB, 0)
	pkts[1].SrcPort = 0xc155
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, 2, 5*time.Second)
	for i, want := range []uint16{Port, 0xc155} {
		if pkts[i].SrcPort != want || got[i].SrcPort != want {
			t.Errorf("packet %d: SrcPort after Send %d, received from port %d; want %d", i, pkts[i].SrcPort, got[i].SrcPort, want)
		}
	}
}
