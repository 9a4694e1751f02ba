//go:build linux

package udp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
	"weak"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/icrc"
)

func TestSocketSendRecvBatches(t *testing.T) { forGRO(t, "", testSocketSendRecvBatches) }

func testSocketSendRecvBatches(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, nil, ob)
	const total = 150 // more than one sendmmsg batch
	sizes := []int{16, 17, 64, 1024 + 28, 4096 + 32, MaxPacketSize}
	pkts := make([]Packet, total)
	want := make([][]byte, total)
	for i := range pkts {
		size := sizes[i%len(sizes)]
		pkts[i] = Packet{Buf: testPayload(make([]byte, size), uint32(i), size), Addr: sockB, SrcPort: 0xc123}
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	for i := range pkts {
		// The ICRC Send filled in is the one for the header Linux sends:
		// ID 0, DF, the link's send port (SrcPort asked for is ignored
		// without SourcePorts, and Send says which port it used).
		if pkts[i].SrcPort != a.SendPort() || a.SendPort() == 0 || a.SendPort() == Port {
			t.Fatalf("packet %d: SrcPort after Send %d, SendPort %d", i, pkts[i].SrcPort, a.SendPort())
		}
		h := icrc.IPv4Pseudo{Src: sockA.As4(), Dst: sockB.As4(), ID: 0, FlagsFrag: 0x4000, SrcPort: a.SendPort(), DstPort: Port}
		if got, w := icrc.Load(pkts[i].Buf), icrc.ComputeIPv4(&h, pkts[i].Buf); got != w {
			t.Fatalf("packet %d: ICRC %#08x, want %#08x", i, got, w)
		}
		want[i] = bytes.Clone(pkts[i].Buf)
	}
	got := recvN(t, b, total, 10*time.Second)
	for i, p := range got {
		if !bytes.Equal(p.Buf, want[i]) {
			t.Fatalf("packet %d differs (len %d, want %d)", i, len(p.Buf), len(want[i]))
		}
		if p.Addr != sockA || p.SrcPort != a.SendPort() {
			t.Fatalf("packet %d from %v:%d, want %v:%d", i, p.Addr, p.SrcPort, sockA, a.SendPort())
		}
	}
	if s := a.Stats(); s.SentPkts != total {
		t.Errorf("sender stats %+v", s)
	}
	if s := b.Stats(); s != (Stats{RcvdPkts: total}) {
		t.Errorf("receiver stats %+v", s)
	}
}

func TestSocketTOSAndECN(t *testing.T) { forGRO(t, "", testSocketTOSAndECN) }

func testSocketTOSAndECN(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, nil, ob)
	tests := []uint8{0, ECNECT0, ECNECT1, ECNCE, 0xb8 | ECNCE}
	for i, tos := range tests {
		p := []Packet{{Buf: testPayload(make([]byte, 64), uint32(i), 64), Addr: sockB, TOS: tos}}
		if err := a.Send(p); err != nil {
			t.Fatal(err)
		}
		got := recvN(t, b, 1, 5*time.Second)
		if got[0].TOS != tos {
			t.Errorf("sent TOS %#02x, received %#02x", tos, got[0].TOS)
		}
	}
}

func TestSocketDropsGarbage(t *testing.T) { forGRO(t, "", testSocketDropsGarbage) }

func testSocketDropsGarbage(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, nil, ob)
	raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dst := &net.UDPAddr{IP: sockB.AsSlice(), Port: Port}
	rng := rand.New(rand.NewPCG(1, 2))
	var garbage [][]byte
	for _, n := range []int{0, 1, 11, 15} { // shorter than BTH+ICRC
		garbage = append(garbage, make([]byte, n))
	}
	malformed := len(garbage)
	for range 5 { // random bytes
		g := make([]byte, 16+rng.IntN(300))
		for i := range g {
			g[i] = byte(rng.Uint32())
		}
		garbage = append(garbage, g)
	}
	bad := testPayload(make([]byte, 64), 9, 64) // RoCE-looking, wrong ICRC
	icrc.Store(bad, 0x12345678)
	garbage = append(garbage, bad)
	badICRC := len(garbage) - malformed
	for _, g := range garbage {
		if _, err := raw.WriteToUDP(g, dst); err != nil {
			t.Fatal(err)
		}
	}
	// A correct packet from the plain socket's ephemeral port: the ICRC
	// covers the source port, so the receiver must use the real one.
	lport := uint16(raw.LocalAddr().(*net.UDPAddr).Port)
	good := testPayload(make([]byte, 80), 77, 80)
	h := icrc.IPv4Pseudo{Src: sockA.As4(), Dst: sockB.As4(), FlagsFrag: 0x4000, SrcPort: lport, DstPort: Port}
	icrc.Store(good, icrc.ComputeIPv4(&h, good))
	if _, err := raw.WriteToUDP(good, dst); err != nil {
		t.Fatal(err)
	}
	if err := a.Send([]Packet{{Buf: testPayload(make([]byte, 64), 78, 64), Addr: sockB}}); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, 2, 5*time.Second)
	if seqOf(got[0].Buf) != 77 || got[0].SrcPort != lport || seqOf(got[1].Buf) != 78 {
		t.Errorf("received seq %d from port %d, seq %d; want 77 from %d, 78", seqOf(got[0].Buf), got[0].SrcPort, seqOf(got[1].Buf), lport)
	}
	s := b.Stats()
	if s.DropMalformed != uint64(malformed) || s.DropBadICRC != uint64(badICRC) || s.RcvdPkts != 2 {
		t.Errorf("stats %+v, want %d malformed, %d bad ICRC, 2 received", s, malformed, badICRC)
	}
}

func TestSocketIPv6(t *testing.T) {
	lo6 := netip.IPv6Loopback()
	l := listenLoopback6(t, nil)
	p := []Packet{{Buf: testPayload(make([]byte, 256), 3, 256), Addr: lo6, TOS: ECNCE}}
	if err := l.Send(p); err != nil {
		t.Fatal(err)
	}
	h := icrc.IPv6Pseudo{Src: lo6.As16(), Dst: lo6.As16(), SrcPort: l.SendPort(), DstPort: Port}
	if icrc.Load(p[0].Buf) != icrc.ComputeIPv6(&h, p[0].Buf) {
		t.Fatal("IPv6 ICRC not filled for the real header")
	}
	// A flipped payload bit must be caught (IPv6 is verified fully).
	corrupt := bytes.Clone(p[0].Buf)
	corrupt[40] ^= 0x10
	raw, err := net.ListenUDP("udp6", &net.UDPAddr{IP: lo6.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.WriteToUDP(corrupt, &net.UDPAddr{IP: lo6.AsSlice(), Port: Port}); err != nil {
		t.Fatal(err)
	}
	if err := l.Send(p); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, l, 2, 5*time.Second)
	for _, g := range got {
		if g.Addr != lo6 || g.SrcPort != l.SendPort() || g.TOS != ECNCE || seqOf(g.Buf) != 3 {
			t.Errorf("got %v:%d tos %d seq %d", g.Addr, g.SrcPort, g.TOS, seqOf(g.Buf))
		}
	}
	if s := l.Stats(); s.DropBadICRC != 1 || s.RcvdPkts != 2 {
		t.Errorf("stats %+v, want 1 bad ICRC, 2 received", s)
	}
}

func TestSocketListenErrors(t *testing.T) {
	a, err := ListenSocket(sockA, &SocketOptions{Share: ShareOff})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, err = ListenSocket(sockA, nil)
	if want := sockA.String() + ":4791"; !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), want) {
		t.Errorf("second listen: %v, want EADDRINUSE naming %s", err, want)
	}
	_, err = ListenSocket(netip.MustParseAddr("203.0.113.77"), nil)
	if !errors.Is(err, syscall.EADDRNOTAVAIL) || !strings.Contains(err.Error(), "203.0.113.77:4791") {
		t.Errorf("foreign address: %v, want EADDRNOTAVAIL naming 203.0.113.77:4791", err)
	}
	for _, bad := range []netip.Addr{{}, netip.IPv4Unspecified(), netip.MustParseAddr("224.0.0.1")} {
		if _, err := ListenSocket(bad, nil); !errors.Is(err, ErrAddress) {
			t.Errorf("ListenSocket(%v) = %v, want ErrAddress", bad, err)
		}
	}
	if err := a.Send([]Packet{{Buf: make([]byte, 8), Addr: sockB}}); !errors.Is(err, ErrPacketSize) {
		t.Errorf("short Send: %v", err)
	}
	if err := a.Send([]Packet{{Buf: make([]byte, 64), Addr: netip.IPv6Loopback()}}); !errors.Is(err, ErrAddress) {
		t.Errorf("IPv6 destination from IPv4 link: %v", err)
	}
	if _, err := a.Recv([]Packet{{Buf: make([]byte, 64)}}); !errors.Is(err, ErrShortBuffer) {
		t.Errorf("Recv small buffer: %v", err)
	}
}

func TestSocketCloseUnblocksRecv(t *testing.T) {
	a, err := ListenSocket(sockA, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeUnblocksRecv(t, a, recvBufs(4))
	// The port is free again.
	b, err := ListenSocket(sockA, nil)
	if err != nil {
		t.Fatalf("re-listen after Close: %v", err)
	}
	b.Close()
}

func TestSocketBuffers(t *testing.T) {
	a, err := ListenSocket(sockA, &SocketOptions{RecvBufferSize: 4 << 20, SendBufferSize: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rcv, snd, err := a.SocketBuffers()
	if err != nil {
		t.Fatal(err)
	}
	// Linux doubles the value for bookkeeping; without CAP_NET_ADMIN it is
	// capped by net.core.rmem_max / wmem_max.
	if unix.Geteuid() == 0 && (rcv < 4<<20 || snd < 2<<20) {
		t.Errorf("SO_RCVBUF %d, SO_SNDBUF %d; want >= 4 MiB, 2 MiB", rcv, snd)
	}
}

// TestSocketWireHeader captures the sent datagrams on lo with an AF_PACKET
// socket and checks the IPv4 header Linux produced: DF set, identification
// 0, and the ICRC valid over the whole IP packet (root only).
//
// lo carries the traffic of every test running on the host (other packages
// blast 127.0.0.1 <-> 127.0.0.2), which used to fill an unfiltered capture
// socket's queue so that these datagrams were dropped. So the capture socket
// is opened with protocol 0 (it receives nothing yet), gets a kernel filter
// for exactly sockA -> sockB:4791, and only then is bound to lo; it exists
// before the first datagram is sent.
func TestSocketWireHeader(t *testing.T) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Skipf("AF_PACKET capture needs CAP_NET_RAW: %v", err)
	}
	defer unix.Close(fd)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Skip(err)
	}
	if err := attachFilter(fd, captureFilter(sockA, sockB)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	tv := unix.Timeval{Usec: 100000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	a, b := listenPair(t)
	const count, firstSeq = 3, 0x4242
	for i := range count {
		pkt := testPayload(make([]byte, 200), firstSeq+uint32(i), 200)
		if err := a.Send([]Packet{{Buf: pkt, Addr: sockB, TOS: ECNCE}}); err != nil {
			t.Fatal(err)
		}
	}
	recvN(t, b, count, 5*time.Second)
	buf := make([]byte, 65536)
	seen := make(map[uint32]bool) // by sequence number: each datagram once
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < count {
		if time.Now().After(deadline) {
			st, _ := unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
			t.Fatalf("captured %d of %d datagrams (capture socket: %+v)", len(seen), count, st)
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		ip := buf[:n]
		if n < 28 || ip[0] != 0x45 || ip[9] != unix.IPPROTO_UDP ||
			netip.AddrFrom4([4]byte(ip[12:16])) != sockA || netip.AddrFrom4([4]byte(ip[16:20])) != sockB ||
			binary.BigEndian.Uint16(ip[22:24]) != Port || n < 28+minPacketSize {
			t.Fatalf("capture filter passed a datagram that is not %v -> %v:%d: % x", sockA, sockB, Port, ip[:min(n, 28)])
		}
		seq := seqOf(ip[28:])
		if seq < firstSeq || seq >= firstSeq+count {
			t.Fatalf("captured sequence number %#x, want %#x..%#x", seq, firstSeq, firstSeq+count-1)
		}
		if seen[seq] {
			continue // a second copy of the same datagram
		}
		seen[seq] = true
		if id := binary.BigEndian.Uint16(ip[4:6]); id != 0 {
			t.Errorf("IPv4 identification %#04x, want 0", id)
		}
		if ff := binary.BigEndian.Uint16(ip[6:8]); ff != 0x4000 {
			t.Errorf("IPv4 flags/fragment %#04x, want DF (0x4000)", ff)
		}
		if ip[1]&3 != ECNCE {
			t.Errorf("ECN %d on the wire, want CE", ip[1]&3)
		}
		if err := icrc.Verify(ip); err != nil {
			t.Errorf("ICRC over the captured IP packet: %v", err)
		}
	}
}

// captureFilter returns a classic BPF program for an AF_PACKET SOCK_DGRAM
// socket (the packet starts at the IP header) that passes only IPv4 UDP
// datagrams src -> dst:4791 that are not non-first fragments.
func captureFilter(src, dst netip.Addr) []unix.SockFilter {
	s4, d4 := src.As4(), dst.As4()
	const drop = 12                                // index of the final "ret 0"
	jeq := func(i int, k uint32) unix.SockFilter { // at index i: equal: next, else drop
		return unix.SockFilter{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jf: uint8(drop - i - 1), K: k}
	}
	return []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_B | unix.BPF_ABS, K: 9}, // 0: protocol
		jeq(1, unix.IPPROTO_UDP),
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 12}, // 2: source
		jeq(3, binary.BigEndian.Uint32(s4[:])),
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 16}, // 4: destination
		jeq(5, binary.BigEndian.Uint32(d4[:])),
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_ABS, K: 6}, // 6: fragment offset
		{Code: unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K, Jt: drop - 8, K: 0x1fff},
		{Code: unix.BPF_LDX | unix.BPF_B | unix.BPF_MSH, K: 0}, // 8: X = IHL*4
		{Code: unix.BPF_LD | unix.BPF_H | unix.BPF_IND, K: 2},  // 9: UDP destination port
		jeq(10, Port),
		{Code: unix.BPF_RET | unix.BPF_K, K: 0xffff}, // 11
		{Code: unix.BPF_RET | unix.BPF_K, K: 0},      // 12: drop
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// rawUDP is the benchmark baseline: a plain blocking UDP socket driven with
// sendmmsg/recvmmsg directly, no ICRC, no netpoller.
// interrupted reports whether a blocking receive of rawUDP was cut short by
// a signal and must be retried: EINTR, or ERESTARTSYS (see errRestartSys).
func interrupted(e unix.Errno) bool { return e == unix.EINTR || e == errRestartSys }

type rawUDP struct {
	fd    int
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet4

	// GSO / GRO (bench_linux_test.go), allocated on first use.
	gsoIovs []unix.Iovec
	ctrl    []byte
	groMem  []byte
	groCtrl []byte
	groIov  []unix.Iovec
	tos     uint8 // of the last recvTOS
}

func newRawUDP(t testing.TB, addr netip.Addr, batch int) *rawUDP {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, defaultSocketBuf)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, defaultSocketBuf)
	unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: Port + 1}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	r := &rawUDP{fd: fd, hdrs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, batch), names: make([]unix.RawSockaddrInet4, batch)}
	for i := range r.hdrs {
		r.hdrs[i].Hdr.Iov = &r.iovs[i]
		r.hdrs[i].Hdr.SetIovlen(1)
		r.hdrs[i].Hdr.Name = (*byte)(unsafe.Pointer(&r.names[i]))
	}
	t.Cleanup(func() { unix.Close(fd) })
	return r
}

func (r *rawUDP) send(bufs [][]byte, dst netip.Addr) error {
	for i, b := range bufs {
		r.iovs[i].Base = &b[0]
		r.iovs[i].SetLen(len(b))
		r.names[i].Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&r.names[i].Port))[:], Port+1)
		r.names[i].Addr = dst.As4()
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	for off := 0; off < len(bufs); {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[off])), uintptr(len(bufs)-off), 0, 0, 0)
		if e != 0 {
			return e
		}
		off += int(n)
	}
	return nil
}

func (r *rawUDP) recv(bufs [][]byte) (int, error) {
	for i, b := range bufs {
		r.iovs[i].Base = &b[0]
		r.iovs[i].SetLen(len(b))
		r.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet4
	}
	var n uintptr
	var e unix.Errno
	for {
		n, _, e = unix.Syscall6(unix.SYS_RECVMMSG, uintptr(r.fd), uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(bufs)), 0, 0, 0)
		if !interrupted(e) {
			break
		}
	}
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// BenchmarkSocket compares SocketLink with raw sendmmsg/recvmmsg over
// loopback, 64 datagrams per call, in the same run.
func BenchmarkSocket(b *testing.B) {
	const batch = 64
	for _, size := range []int{1024, 4096} {
		name := map[int]string{1024: "1KiB", 4096: "4KiB"}[size]
		b.Run("raw-mmsg/"+name, func(b *testing.B) {
			s := newRawUDP(b, sockA, batch)
			r := newRawUDP(b, sockB, batch)
			out := make([][]byte, batch)
			in := make([][]byte, batch)
			for i := range out {
				out[i] = testPayload(make([]byte, size), uint32(i), size)
				in[i] = make([]byte, MaxPacketSize)
			}
			benchExchange(b, size, batch, func() error { return s.send(out, sockB) },
				func(max int) (int, error) { return r.recv(in[:max]) })
		})
		for _, mode := range []string{"SocketLink", "SocketLink-GRO", "SocketLink-GSO", "SocketLink-GSO-GRO"} {
			gso := strings.Contains(mode, "GSO")
			gro := strings.Contains(mode, "GRO")
			b.Run(mode+"/"+name, func(b *testing.B) {
				s, err := ListenSocket(sockA, &SocketOptions{GSO: gso})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				r, err := ListenSocket(sockB, &SocketOptions{NoGRO: !gro})
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				benchLinks(b, s, r, testPackets(batch, size, sockB, 0))
			})
		}
	}
}

func TestGSOGroup(t *testing.T) {
	mk := func(n int, size int, dst netip.Addr, tos uint8) []Packet {
		p := make([]Packet, n)
		for i := range p {
			p[i] = Packet{Buf: make([]byte, size), Addr: dst, TOS: tos}
		}
		return p
	}
	cat := func(ps ...[]Packet) []Packet { return slices.Concat(ps...) }
	tests := []struct {
		name string
		pkts []Packet
		want int
	}{
		{"single", mk(1, 100, sockB, 0), 1},
		{"same size", mk(10, 100, sockB, 0), 10},
		{"short tail joins", cat(mk(3, 100, sockB, 0), mk(2, 50, sockB, 0)), 4},
		{"longer breaks", cat(mk(3, 100, sockB, 0), mk(2, 150, sockB, 0)), 3},
		{"other dst breaks", cat(mk(2, 100, sockB, 0), mk(2, 100, sockA, 0)), 2},
		{"other TOS breaks", cat(mk(2, 100, sockB, 0), mk(2, 100, sockB, ECNCE)), 2},
		{"segment limit", mk(100, 100, sockB, 0), gsoMaxSegs},
		{"byte limit", mk(40, 4096, sockB, 0), gsoMaxBytes / 4096},
	}
	for _, tc := range tests {
		if got := gsoGroup(tc.pkts); got != tc.want {
			t.Errorf("%s: gsoGroup = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestSocketGSO sends with UDP GSO and checks every segment arrives intact
// and that its ICRC was computed for the identification Linux gave it
// (0, 1, 2, ... within each GSO datagram).
func TestSocketGSO(t *testing.T) { forGRO(t, " receiver", testSocketGSO) }

func testSocketGSO(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, ob)
	var pkts []Packet
	add := func(n, size int, tos uint8) {
		for range n {
			seq := uint32(len(pkts))
			pkts = append(pkts, Packet{Buf: testPayload(make([]byte, size), seq, size), Addr: sockB, TOS: tos})
		}
	}
	add(20, 1052, 0)
	add(1, 300, 0)
	add(17, 4124, ECNCE)
	add(1, 64, 0)
	add(70, 1052, 0)
	var wantIDs []uint16
	for base := 0; base < len(pkts); base += a.BatchSize() { // Send works in BatchSize chunks
		chunk := pkts[base:min(base+a.BatchSize(), len(pkts))]
		for i := 0; i < len(chunk); {
			g := gsoGroup(chunk[i:])
			for k := range g {
				wantIDs = append(wantIDs, uint16(k))
			}
			i += g
		}
	}
	var gotIDs []uint16
	testHookIPv4ID = func(id uint16) { gotIDs = append(gotIDs, id) }
	defer func() { testHookIPv4ID = nil }()
	want := make([][]byte, len(pkts))
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	for i := range pkts {
		want[i] = bytes.Clone(pkts[i].Buf)
	}
	got := recvN(t, b, len(pkts), 10*time.Second)
	for i, p := range got {
		if !bytes.Equal(p.Buf, want[i]) || p.TOS != pkts[i].TOS {
			t.Fatalf("segment %d: len %d tos %d, want len %d tos %d", i, len(p.Buf), p.TOS, len(want[i]), pkts[i].TOS)
		}
	}
	if !slices.Equal(gotIDs, wantIDs) {
		t.Errorf("IPv4 IDs of GSO segments = %v, want %v", gotIDs, wantIDs)
	}
	if s := a.Stats(); s.SentPkts != uint64(len(pkts)) {
		t.Errorf("SentPkts = %d, want %d", s.SentPkts, len(pkts))
	}
	if !ob.NoGRO && b.groCoalesced.Load() == 0 {
		t.Errorf("GRO receiver never got a coalesced buffer from a GSO sender on lo")
	}
	if s := b.Stats(); s != (Stats{RcvdPkts: uint64(len(pkts))}) {
		t.Errorf("receiver stats %+v", s)
	}
}

// TestSocketGSOSendOneCall: with GSO, a Send of more than BatchSize
// packets leaves in one sendmmsg when its GSO datagrams fit in one
// (BatchSize messages): 128 equal packets, BatchSize 64, are one call of
// two datagrams of 64 segments — the datagrams, and so the segments' IPv4
// identifications (0-63 twice), those of two calls of 64 packets.
func TestSocketGSOSendOneCall(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, &SocketOptions{})
	pkts := make([]Packet, 2*a.BatchSize())
	want := make([][]byte, len(pkts))
	for i := range pkts {
		pkts[i] = Packet{Buf: testPayload(make([]byte, 200), uint32(i), 200), Addr: sockB}
	}
	var gotIDs []uint16
	testHookIPv4ID = func(id uint16) { gotIDs = append(gotIDs, id) }
	defer func() { testHookIPv4ID = nil }()
	calls := a.send.calls
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	if n := a.send.calls - calls; n != 1 {
		t.Errorf("%d sendmmsg calls for %d packets in 2 GSO datagrams, want 1", n, len(pkts))
	}
	for i := range pkts {
		want[i] = bytes.Clone(pkts[i].Buf)
	}
	got := recvN(t, b, len(pkts), 10*time.Second)
	for i, p := range got {
		if !bytes.Equal(p.Buf, want[i]) {
			t.Fatalf("packet %d: %d bytes, seq %d, want seq %d", i, len(p.Buf), seqOf(p.Buf), i)
		}
	}
	var wantIDs []uint16
	for i := range pkts {
		wantIDs = append(wantIDs, uint16(i%a.BatchSize()))
	}
	if !slices.Equal(gotIDs, wantIDs) {
		t.Errorf("IPv4 IDs of the GSO segments = %v, want 0-63 twice", gotIDs)
	}
	if n := b.GROCoalesced(); n != 2 {
		t.Errorf("receiver got %d coalesced buffers, want 2 (two GSO datagrams of 64)", n)
	}
}

// TestSocketGROSmallRecv returns the segments of coalesced buffers through
// Recv calls with fewer slots than segments.
func TestSocketGROSmallRecv(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, &SocketOptions{})
	const total = 40
	pkts := make([]Packet, total)
	for i := range pkts {
		pkts[i] = Packet{Buf: testPayload(make([]byte, 1000), uint32(i), 1000), Addr: sockB}
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	r := recvBufs(3)
	for got := 0; got < total; {
		n, err := b.Recv(r)
		if err != nil {
			t.Fatal(err)
		}
		if n > len(r) {
			t.Fatalf("Recv returned %d > %d slots", n, len(r))
		}
		for i := range n {
			if s := seqOf(r[i].Buf); s != uint32(got+i) || len(r[i].Buf) != 1000 {
				t.Fatalf("packet %d: seq %d len %d", got+i, s, len(r[i].Buf))
			}
		}
		got += n
	}
	if b.groCoalesced.Load() == 0 {
		t.Errorf("no coalesced buffer")
	}
}

func TestSocketSourcePorts(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{SourcePorts: true}, nil)
	var ids []uint16
	testHookIPv4ID = func(id uint16) { ids = append(ids, id) }
	defer func() { testHookIPv4ID = nil }()
	// A port another socket holds: its packets fall back to the link's
	// send port, as do ports 0 and 4791.
	busy, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := uint16(busy.LocalAddr().(*net.UDPAddr).Port)
	ports := []uint16{FlowSourcePort(0x12, 0x12), FlowSourcePort(0x11, 0x11), 0, busyPort, Port}
	sp := a.SendPort()
	wantPort := []uint16{ports[0], ports[1], sp, sp, sp}
	var pkts []Packet
	var want []uint16
	for r := range 30 { // runs of 1..4 packets per port
		pi := r % len(ports)
		for range r%4 + 1 {
			seq := uint32(len(pkts))
			pkts = append(pkts, Packet{Buf: testPayload(make([]byte, 500), seq, 500), Addr: sockB, SrcPort: ports[pi]})
			want = append(want, wantPort[pi])
		}
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, len(pkts), 10*time.Second)
	for i, p := range got {
		if seqOf(p.Buf) != uint32(i) || p.SrcPort != want[i] {
			t.Fatalf("packet %d: seq %d from port %d, want seq %d from port %d", i, seqOf(p.Buf), p.SrcPort, i, want[i])
		}
	}
	if n := a.portFallbacks.Load(); n != 1 {
		t.Errorf("port fallbacks = %d, want 1 (the busy port)", n)
	}
	for i, id := range ids {
		if id != 0 {
			t.Fatalf("packet %d left with IPv4 ID %d, want 0 (DF, unconnected)", i, id)
		}
	}
	// The source-port sockets close with the link.
	a.Close()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice(), Port: int(ports[0])})
	if err != nil {
		t.Fatalf("source port %d still bound after Close: %v", ports[0], err)
	}
	c.Close()
	if err := a.Send(pkts[:1]); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v, want net.ErrClosed", err)
	}
}

// FuzzParseCmsgs: the control-message walker never panics or reads past
// its buffer.
func FuzzParseCmsgs(f *testing.F) {
	b := make([]byte, cmsgSpace)
	n := putTOSCmsg(b, ECNCE, false)
	n += putGSOCmsg(b[n:], 1000)
	f.Add(b[:n])
	f.Add([]byte{})
	f.Add(make([]byte, 17))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
			b = append(make([]byte, 0, len(b)), b...) // the kernel's buffer is aligned
		}
		parseCmsgs(b)
	})
}

func TestParseCmsgs(t *testing.T) {
	b := make([]byte, cmsgSpace)
	n := putTOSCmsg(b, ECNCE, false)
	// A received UDP_GRO cmsg carries an int.
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[n]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_GRO
	h.SetLen(unix.CmsgLen(4))
	*(*int32)(unsafe.Pointer(&b[n+unix.CmsgLen(0)])) = 1052
	n += unix.CmsgSpace(4)
	if c := parseCmsgs(b[:n]); c.tos != ECNCE || c.groSize != 1052 || c.hasOvfl {
		t.Errorf("parseCmsgs = %+v; want tos 3, gro 1052, no drop count", c)
	}
	// SO_RXQ_OVFL carries a u32, the socket's cumulative drop count.
	h = (*unix.Cmsghdr)(unsafe.Pointer(&b[n]))
	h.Level, h.Type = unix.SOL_SOCKET, unix.SO_RXQ_OVFL
	h.SetLen(unix.CmsgLen(4))
	*(*uint32)(unsafe.Pointer(&b[n+unix.CmsgLen(0)])) = 0xfffffff0
	n += unix.CmsgSpace(4)
	if n > cmsgSpace {
		t.Fatalf("three control messages take %d bytes, cmsgSpace is %d", n, cmsgSpace)
	}
	if c := parseCmsgs(b[:n]); c.tos != ECNCE || c.groSize != 1052 || !c.hasOvfl || c.drops != 0xfffffff0 {
		t.Errorf("parseCmsgs = %+v; want tos 3, gro 1052, drops 0xfffffff0", c)
	}
	if c := parseCmsgs(b[:5]); c != (rxCmsgs{}) {
		t.Errorf("truncated: %+v", c)
	}
}

// TestKernelDropsWrap: the 32-bit drop count of SO_RXQ_OVFL and SO_MEMINFO
// continues into 64 bits across its wrap.
func TestKernelDropsWrap(t *testing.T) {
	var k kernelDrops
	for _, c := range []struct {
		v    uint32
		want uint64
	}{{5, 5}, {5, 5}, {0x80000000, 0x80000000}, {0xffffffff, 0xffffffff}, {3, 1<<32 + 3}, {2, 1<<32 + 3} /* older: ignored */, {10, 1<<32 + 10}} {
		k.see(c.v)
		if got := k.total.Load(); got != c.want {
			t.Fatalf("after %#x: total %#x, want %#x", c.v, got, c.want)
		}
	}
	for _, c := range []struct {
		seen uint64
		now  uint32
		want uint64
	}{{0, 0, 0}, {0, 7, 7}, {5, 9, 9}, {0xfffffffe, 1, 1<<32 + 1}, {1<<32 + 10, 12, 1<<32 + 12}, {1<<32 + 10, 10, 1<<32 + 10}} {
		if got := reconcileDrops(c.seen, c.now); got != c.want {
			t.Errorf("reconcileDrops(%#x, %#x) = %#x, want %#x", c.seen, c.now, got, c.want)
		}
	}
}

func TestSocketIPv6GSO(t *testing.T) {
	lo6 := netip.IPv6Loopback()
	l := listenLoopback6(t, &SocketOptions{GSO: true, SourcePorts: true})
	const total = 30
	pkts := make([]Packet, total)
	for i := range pkts {
		pkts[i] = Packet{Buf: testPayload(make([]byte, 2048), uint32(i), 2048), Addr: lo6, SrcPort: 0xc321, TOS: ECNECT1}
	}
	if err := l.Send(pkts); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, l, total, 5*time.Second)
	for i, p := range got {
		if seqOf(p.Buf) != uint32(i) || len(p.Buf) != 2048 || p.SrcPort != 0xc321 || p.TOS != ECNECT1 || p.Addr != lo6 {
			t.Fatalf("packet %d: seq %d len %d from [%v]:%d tos %d", i, seqOf(p.Buf), len(p.Buf), p.Addr, p.SrcPort, p.TOS)
		}
	}
	if l.groCoalesced.Load() == 0 {
		t.Errorf("IPv6 GSO datagram was not received coalesced")
	}
	if s := l.Stats(); s.DropBadICRC != 0 || s.RcvdPkts != total {
		t.Errorf("stats %+v", s)
	}
}

// TestNilSocketOptions: ListenSocket with nil options is ListenSocket with
// the zero SocketOptions (no GSO, GRO on, the default batch), and given
// options apply.
func TestNilSocketOptions(t *testing.T) {
	l, err := ListenSocket(sockA, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l.gso || l.gro == nil || l.BatchSize() != defaultSocketBatch {
		t.Errorf("nil options: gso %v, gro %v, batch %d", l.gso, l.gro != nil, l.BatchSize())
	}
	l.Close()
	l, err = ListenSocket(sockA, &SocketOptions{GSO: true, NoGRO: true, BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if !l.gso || l.gro != nil || l.BatchSize() != 7 {
		t.Errorf("options {GSO, NoGRO, BatchSize 7}: gso %v, gro %v, batch %d", l.gso, l.gro != nil, l.BatchSize())
	}
}

// TestSocketLeakedIsClosed: a link dropped without Close releases its
// address:port once collected, as a leaked net.UDPConn does.
func TestSocketLeakedIsClosed(t *testing.T) {
	func() {
		if _, err := ListenSocket(sockA, nil); err != nil {
			t.Fatal(err)
		}
	}()
	for i := 0; ; i++ {
		runtime.GC()
		l, err := ListenSocket(sockA, nil)
		if err == nil {
			l.Close()
			return
		}
		if i == 50 {
			t.Fatalf("address still in use after the leaked link was collected: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSocketClosedIsCollected: a closed link is garbage collected even
// though its ICMP error handler (a transport.Device's, in real use) refers
// back to it. The handler used to stay in the error watcher, which the
// link's cleanup keeps alive until the link is collected: each closed
// device of a long-running program kept its link's buffers (4.7 MB) for
// ever.
func TestSocketClosedIsCollected(t *testing.T) {
	wp := func() weak.Pointer[SocketLink] {
		l, err := ListenSocket(sockA, &SocketOptions{Share: ShareOff})
		if err != nil {
			t.Fatal(err)
		}
		l.SetErrorHandler(func(*ICMPError) { _ = l.LocalAddr() })
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		return weak.Make(l)
	}()
	for i := 0; wp.Value() != nil; i++ {
		if i == 20 {
			t.Fatal("a closed link whose error handler refers to it is never collected")
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSocketSourcePortsOwnPort: with SourcePorts, a packet asking for the
// link's own SendPort — which is what Send leaves in Packet.SrcPort for
// ports it could not use, so a resent Packet asks for it — goes out from the
// link's socket without a failed bind counted as a fallback.
func TestSocketSourcePortsOwnPort(t *testing.T) {
	a, err := ListenSocket(sockA, &SocketOptions{SourcePorts: true, NoGRO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := ListenSocket(sockB, &SocketOptions{NoGRO: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	pkts := testPackets(2, 100, sockB, a.SendPort())
	pkts[1].SrcPort = 0
	for round := range 2 { // the second round resends with the ports Send set
		if err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
		got := recvN(t, b, 2, 5*time.Second)
		for i := range pkts {
			if pkts[i].SrcPort != a.SendPort() || got[i].SrcPort != a.SendPort() {
				t.Errorf("round %d packet %d: SrcPort after Send %d, received from %d; want SendPort %d",
					round, i, pkts[i].SrcPort, got[i].SrcPort, a.SendPort())
			}
		}
	}
	if n := a.SourcePortFallbacks(); n != 0 {
		t.Errorf("SourcePortFallbacks = %d, want 0: the link's own port is no fallback", n)
	}
}

// TestSocketKernelDrops: datagrams the kernel drops because the receive
// buffer is full are counted in Stats.DropKernel, so that every datagram
// sent is either received or counted.
func TestSocketKernelDrops(t *testing.T) {
	a, b := listenPairOpts(t, nil, &SocketOptions{RecvBufferSize: 4096, NoGRO: true})
	const total = 300
	pkts := make([]Packet, total)
	for i := range pkts {
		pkts[i] = Packet{Buf: testPayload(make([]byte, 1024), uint32(i), 1024), Addr: sockB}
	}
	if err := a.Send(pkts); err != nil { // nobody receives yet: the buffer overflows
		t.Fatal(err)
	}
	// Loopback delivery may finish in a softirq after Send returns: wait
	// (bounded) for the first drops before receiving anything.
	for i := 0; b.Stats().DropKernel == 0 && i < 500; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if d := b.Stats().DropKernel; d == 0 || d >= total {
		t.Fatalf("DropKernel %d after %d datagrams of 1 KiB into a ~4 KiB receive buffer", d, total)
	}
	go func() { // receives until the link is closed at cleanup
		r := recvBufs(64)
		for {
			if _, err := b.Recv(r); err != nil {
				return
			}
		}
	}()
	var st Stats
	for i := 0; i < 1000; i++ {
		if st = b.Stats(); st.RcvdPkts+st.DropKernel == total {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st.RcvdPkts+st.DropKernel != total || st.DropKernel == 0 {
		t.Errorf("received %d + kernel drops %d != %d sent (stats %+v)", st.RcvdPkts, st.DropKernel, total, st)
	}
	// The receive path saw the drops in band (SO_RXQ_OVFL on the
	// datagrams queued after them): all of them once a datagram queued
	// after the last drop was received.
	if err := a.Send(pkts[:1]); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500 && b.Stats().RcvdPkts != st.RcvdPkts+1; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if got := b.KernelDrops(); got != st.DropKernel {
		t.Errorf("KernelDrops (SO_RXQ_OVFL) = %d, want %d (SO_MEMINFO)", got, st.DropKernel)
	}
	if st2 := b.Stats(); st2.DropKernel != st.DropKernel || st2.RcvdPkts != st.RcvdPkts+1 {
		t.Errorf("after one more datagram: %+v, want DropKernel %d and RcvdPkts %d", st2, st.DropKernel, st.RcvdPkts+1)
	}
}

// TestSocketBusyPoll: with BusyPoll a Recv that is polling takes a packet
// that arrives meanwhile without waiting in the poller, and Close ends a
// polling Recv with net.ErrClosed.
func TestSocketBusyPoll(t *testing.T) {
	a, b := listenPairOpts(t, nil, &SocketOptions{BusyPoll: 10 * time.Second, NoGRO: true})
	type res struct {
		n   int
		err error
	}
	recv := func() chan res {
		ch := make(chan res, 1)
		go func() {
			n, err := b.Recv(recvBufs(4))
			ch <- res{n, err}
		}()
		return ch
	}
	ch := recv()
	time.Sleep(20 * time.Millisecond) // let it poll (it would take the packet either way)
	if err := a.Send([]Packet{{Buf: testPayload(make([]byte, 64), 1, 64), Addr: sockB}}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-ch:
		if r.err != nil || r.n != 1 {
			t.Fatalf("Recv = %d, %v", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("polling Recv did not take the packet within 5 s")
	}
	if b.recv.spinHits == 0 {
		t.Error("the packet was not received by busy polling")
	}
	ch = recv()
	time.Sleep(20 * time.Millisecond)
	b.Close()
	select {
	case r := <-ch:
		if !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("Recv after Close = %d, %v; want net.ErrClosed", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("polling Recv still running 5 s after Close")
	}
}

// TestSocketIPv6ZeroChecksum sends an IPv6 RoCEv2 datagram with UDP
// checksum 0, as rxe does, over ::1: Linux drops such a datagram at a
// socket without UDP_NO_CHECK6_RX (checked first on a plain socket, which
// proves the checksum really is 0), and the link must receive it.
func TestSocketIPv6ZeroChecksum(t *testing.T) {
	lo6 := netip.IPv6Loopback()
	l := listenLoopback6(t, nil)
	tx, err := net.ListenUDP("udp6", &net.UDPAddr{IP: lo6.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	rc, err := tx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_NO_CHECK6_TX, 1)
	}); err != nil || serr != nil {
		t.Fatalf("UDP_NO_CHECK6_TX: %v %v", err, serr)
	}
	txPort := uint16(tx.LocalAddr().(*net.UDPAddr).Port)

	// The control: a plain IPv6 socket does not get the datagram.
	plain, err := net.ListenUDP("udp6", &net.UDPAddr{IP: lo6.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := tx.WriteToUDP([]byte("zero checksum"), plain.LocalAddr().(*net.UDPAddr)); err != nil {
		t.Fatal(err)
	}
	plain.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, _, err := plain.ReadFromUDP(make([]byte, 64)); err == nil {
		t.Fatalf("a socket without UDP_NO_CHECK6_RX received %d bytes with UDP checksum 0: the control does not hold", n)
	}

	// The link receives it, ICRC verified over the real pseudo header.
	pkt := testPayload(make([]byte, 300), 7, 300)
	h := icrc.IPv6Pseudo{Src: lo6.As16(), Dst: lo6.As16(), SrcPort: txPort, DstPort: Port}
	icrc.Store(pkt, icrc.ComputeIPv6(&h, pkt))
	if _, err := tx.WriteToUDP(pkt, &net.UDPAddr{IP: lo6.AsSlice(), Port: Port}); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, l, 1, 5*time.Second)
	if g := got[0]; g.Addr != lo6 || g.SrcPort != txPort || seqOf(g.Buf) != 7 || !bytes.Equal(g.Buf, pkt) {
		t.Errorf("got %v:%d seq %d (%d bytes), want %v:%d seq 7 (%d bytes)", g.Addr, g.SrcPort, seqOf(g.Buf), len(g.Buf), lo6, txPort, len(pkt))
	}
	if s := l.Stats(); s.RcvdPkts != 1 || s.DropBadICRC != 0 {
		t.Errorf("stats %+v, want 1 received, no bad ICRC", s)
	}
}

// TestSocketGRORecvInPlace: with SetRecvInPlace the packets of coalesced
// buffers come back as slices of the link's memory (capacity cut at the
// segment, the caller's buffers never written), intact and in order; a
// datagram with a wrong ICRC is still dropped and counted; turned off
// again, Recv fills the caller's buffers.
func TestSocketGRORecvInPlace(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, &SocketOptions{})
	b.SetRecvInPlace(true)
	raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	bad := testPayload(make([]byte, 64), 999, 64)
	icrc.Store(bad, 0x12345678)
	if _, err := raw.WriteToUDP(bad, &net.UDPAddr{IP: sockB.AsSlice(), Port: Port}); err != nil {
		t.Fatal(err)
	}
	const total = 50
	send := func(base uint32) [][]byte {
		pkts := make([]Packet, total)
		for i := range pkts {
			pkts[i] = Packet{Buf: testPayload(make([]byte, 1000), base+uint32(i), 1000), Addr: sockB}
		}
		if err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
		want := make([][]byte, total)
		for i := range pkts {
			want[i] = pkts[i].Buf
		}
		return want
	}
	var gotIDs []uint16
	testHookIPv4ID = func(id uint16) { gotIDs = append(gotIDs, id) }
	defer func() { testHookIPv4ID = nil }()
	want := send(0)
	r := recvBufs(7)
	own := make([][]byte, len(r))
	for i := range r {
		own[i] = r[i].Buf
	}
	// recvAll receives total packets into r, giving it the caller's own
	// buffers before every Recv, and checks each with check.
	recvAll := func(check func(k int, p []byte)) {
		for got := 0; got < total; {
			for i := range r {
				r[i].Buf = own[i]
			}
			n, err := b.Recv(r)
			if err != nil {
				t.Fatal(err)
			}
			for i := range n {
				check(got+i, r[i].Buf)
			}
			got += n
		}
	}
	recvAll(func(k int, p []byte) {
		if !bytes.Equal(p, want[k]) {
			t.Fatalf("packet %d: seq %d len %d, want seq %d len 1000", k, seqOf(p), len(p), k)
		}
		if cap(p) != len(p) {
			t.Fatalf("packet %d handed out in place with cap %d > len %d", k, cap(p), len(p))
		}
	})
	for i, o := range own {
		if slices.ContainsFunc(o, func(c byte) bool { return c != 0 }) {
			t.Fatalf("caller's buffer %d was written in place mode", i)
		}
	}
	if s := b.Stats(); s.DropBadICRC != 1 || s.RcvdPkts != total {
		t.Errorf("stats %+v, want DropBadICRC 1 and RcvdPkts %d", s, total)
	}
	if b.groCoalesced.Load() == 0 {
		t.Errorf("no coalesced buffer")
	}
	// One GSO datagram of 50 segments: identifications 0..49, found from
	// the segment index (icrc.Prefix.SolveIPv4IDFrom).
	if len(gotIDs) != total {
		t.Fatalf("%d IPv4 IDs seen, want %d", len(gotIDs), total)
	}
	for i, id := range gotIDs {
		if id != uint16(i) {
			t.Fatalf("IPv4 IDs of the segments = %v, want 0..%d", gotIDs, total-1)
		}
	}
	b.SetRecvInPlace(false)
	want = send(total)
	recvAll(func(k int, p []byte) {
		if !bytes.Equal(p, want[k]) || cap(p) != MaxPacketSize {
			t.Fatalf("copied packet %d: seq %d len %d cap %d", k, seqOf(p), len(p), cap(p))
		}
	})
}

// TestSocketTOSSocketOption checks the send socket's TOS option
// (SocketLink.sendTOS): the first TOS other than 0 becomes the socket's,
// datagrams with another TOS carry their own control message (0 too), a
// run of tosSwitchAfter datagrams with one other TOS moves the option to
// it, and every datagram arrives with the TOS it was sent with — sent
// packet by packet and in one batch, IPv4 and IPv6, with and without GSO.
func TestSocketTOSSocketOption(t *testing.T) {
	const cnp = 0xc0 // DSCP 48, Not-ECT: what a CNP carries
	var seq []uint8
	add := func(tos uint8, n int) {
		for range n {
			seq = append(seq, tos)
		}
	}
	add(0, 1)
	add(ECNECT0, 3) // becomes the option
	add(cnp, 1)
	add(0, 1) // a control message with 0 overrides the option
	add(ECNECT0, 2)
	add(0, tosSwitchAfter+6) // moves the option to 0
	add(ECNECT0, 1)
	add(ECNCE, tosSwitchAfter-1) // one short of a switch
	add(ECNECT1, 2)
	for _, v6 := range []bool{false, true} {
		for _, gso := range []bool{false, true} {
			for _, batch := range []bool{false, true} {
				name := fmt.Sprintf("v6=%v/gso=%v/batch=%v", v6, gso, batch)
				t.Run(name, func(t *testing.T) {
					var a, b *SocketLink
					dst := sockB
					if v6 {
						a = listenLoopback6(t, &SocketOptions{GSO: gso})
						b, dst = a, netip.IPv6Loopback()
					} else {
						a, b = listenPairOpts(t, &SocketOptions{GSO: gso}, nil)
					}
					pkts := make([]Packet, len(seq))
					for i, tos := range seq {
						pkts[i] = Packet{Buf: testPayload(make([]byte, 64), uint32(i), 64), Addr: dst, TOS: tos}
					}
					got := make([]Packet, 0, len(seq))
					if batch {
						if err := a.Send(pkts); err != nil {
							t.Fatal(err)
						}
						got = recvN(t, b, len(seq), 5*time.Second)
					} else {
						for i := range pkts {
							if err := a.Send(pkts[i : i+1]); err != nil {
								t.Fatal(err)
							}
							got = append(got, recvN(t, b, 1, 5*time.Second)...)
							if i == 1 && (!a.tx.tosSet || a.tx.tos != ECNECT0) {
								t.Errorf("after the first ECT(0): socket TOS %#x set %v, want %#x", a.tx.tos, a.tx.tosSet, ECNECT0)
							}
						}
					}
					for i, p := range got {
						if s := seqOf(p.Buf); s != uint32(i) || p.TOS != seq[i] {
							t.Fatalf("datagram %d: seq %d TOS %#x, want seq %d TOS %#x", i, s, p.TOS, i, seq[i])
						}
					}
					// The last switch was to 0 (the ECN-CE run is one short).
					if !a.tx.tosSet || a.tx.tos != 0 {
						t.Errorf("socket TOS at the end %#x (set %v), want 0", a.tx.tos, a.tx.tosSet)
					}
				})
			}
		}
	}
}

// TestSocketTOSNoControlMessage: once the socket's TOS option is ECT(0), a
// datagram with ECT(0) is sent without a control message and one with
// another TOS with its IP_TOS message (what sendTOS is for).
func TestSocketTOSNoControlMessage(t *testing.T) {
	a, _ := listenPairOpts(t, nil, nil)
	pk := func(tos uint8) Packet {
		return Packet{Buf: testPayload(make([]byte, 64), 1, 64), Addr: sockB, TOS: tos}
	}
	run := []Packet{pk(ECNECT0), pk(ECNECT0), pk(0xc0), pk(0)}
	a.sendMu.Lock()
	defer a.sendMu.Unlock()
	a.sendTOS(a.tx, run)
	if !a.tx.tosSet || a.tx.tos != ECNECT0 {
		t.Fatalf("socket TOS %#x (set %v), want %#x", a.tx.tos, a.tx.tosSet, ECNECT0)
	}
	n, _ := a.buildSend(run, 0, a.txPort, a.tx.tos)
	defer a.send.clearIovs(len(run))
	if n != len(run) {
		t.Fatalf("%d messages for %d packets without GSO", n, len(run))
	}
	for i, want := range []bool{false, false, true, true} {
		if got := a.send.hdrs[i].Hdr.Controllen > 0; got != want {
			t.Errorf("datagram %d (TOS %#x): control message %v, want %v", i, run[i].TOS, got, want)
		}
	}
}

// TestSocketGROInPlaceThenCopy: a packet of exactly MaxPacketSize handed
// out in place passes checkRecv's capacity test; a copying Recv given it
// back (in-place receive switched off, buffers not reset) must refuse it
// rather than copy into the GRO buffer.
func TestSocketGROInPlaceThenCopy(t *testing.T) {
	a, b := listenPairOpts(t, nil, &SocketOptions{})
	b.SetRecvInPlace(true)
	for i := range 2 {
		if err := a.Send([]Packet{{Buf: testPayload(make([]byte, MaxPacketSize), uint32(i), MaxPacketSize), Addr: sockB}}); err != nil {
			t.Fatal(err)
		}
	}
	r := recvBufs(1)
	if n, err := b.Recv(r); err != nil || n != 1 || len(r[0].Buf) != MaxPacketSize || cap(r[0].Buf) != MaxPacketSize {
		t.Fatalf("in-place Recv: %d %v, len %d cap %d", n, err, len(r[0].Buf), cap(r[0].Buf))
	}
	b.SetRecvInPlace(false)
	if n, err := b.Recv(r); !errors.Is(err, ErrShortBuffer) {
		t.Fatalf("copying Recv into a handed-out packet: %d %v, want ErrShortBuffer", n, err)
	}
	// With its own buffer again it gets the second packet.
	r = recvBufs(1)
	if n, err := b.Recv(r); err != nil || n != 1 || seqOf(r[0].Buf) != 1 {
		t.Fatalf("copying Recv: %d %v", n, err)
	}
}

// closingConn is a send socket whose Write reports net.ErrClosed after
// the call went through: a link closed while its sendmmsg was in flight.
type closingConn struct{ *fdConn }

func (c closingConn) Write(f func(fd uintptr) bool) error {
	c.fdConn.Write(f)
	return net.ErrClosed
}

// TestSendCountsWhatLeftBeforeClose: datagrams a call sent before the
// socket was closed under it are counted as sent (TestVethRC compares the
// count with a capture of the wire, and a link closed during its last
// flush under-counted).
func TestSendCountsWhatLeftBeforeClose(t *testing.T) {
	a, b := listenPairOpts(t, nil, nil)
	run := make([]Packet, 3)
	for i := range run {
		run[i] = Packet{Buf: testPayload(make([]byte, 64), uint32(i), 64), Addr: sockB}
	}
	a.sendMu.Lock()
	n, _ := a.buildSend(run, 0, a.txPort, a.tx.tos)
	var sent atomic.Uint64
	done, err := a.send.send(closingConn{a.tx}, n, &sent)
	a.send.clearIovs(len(run))
	a.sendMu.Unlock()
	if !errors.Is(err, net.ErrClosed) || done != len(run) || sent.Load() != uint64(len(run)) {
		t.Fatalf("send: done %d, counted %d, err %v; want %d, %d, net.ErrClosed", done, sent.Load(), err, len(run), len(run))
	}
	recvN(t, b, len(run), 5*time.Second)
}

// RecvBacklog tells whether datagrams wait unread in the receive socket.
func TestSocketRecvBacklog(t *testing.T) {
	a, b := listenPairOpts(t, nil, &SocketOptions{NoGRO: true})
	if b.RecvBacklog() {
		t.Fatal("backlog on a fresh socket")
	}
	if err := a.Send([]Packet{{Buf: testPayload(make([]byte, 256), 1, 256), Addr: sockB}}); err != nil {
		t.Fatal(err)
	}
	for i := 0; !b.RecvBacklog() && i < 500; i++ { // loopback may deliver in a softirq after Send
		time.Sleep(time.Millisecond)
	}
	if !b.RecvBacklog() {
		t.Fatal("no backlog with a datagram sent and not received")
	}
	if n, err := b.Recv(recvBufs(4)); n != 1 || err != nil {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if b.RecvBacklog() {
		t.Fatal("backlog after the datagram was received")
	}
}

// TestSocketGSOBackToBack: packets that lie back to back in one buffer (as
// a transport builds a window's small packets) leave in one iovec per GSO
// datagram, a zero-copy packet's pad and ICRC join the next packet's
// headers, and every packet arrives intact with its ICRC — the merge
// changes the system call, not the datagrams.
func TestSocketGSOBackToBack(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, nil)
	const n, size = 40, 96
	slab := make([]byte, n*size+64)
	var run []Packet
	for i := range n {
		run = append(run, Packet{Buf: testPayload(slab[i*size:(i+1)*size:(i+1)*size], uint32(i), size), Addr: sockB})
	}
	// One more, not adjacent (its own buffer): a second iovec.
	run = append(run, Packet{Buf: testPayload(make([]byte, size), n, size), Addr: sockB})
	a.sendMu.Lock()
	if m, _ := a.buildSend(run, 0, a.txPort, a.tx.tos); m != 1 {
		t.Errorf("%d messages for %d equal packets with GSO, want 1", m, len(run))
	}
	if got := a.send.hdrs[0].Hdr.Iovlen; got != 2 {
		t.Errorf("%d iovecs for %d packets back to back and one apart, want 2", got, n)
	}
	a.send.clearIovs(a.send.usedIovs)
	// Zero-copy packets: headers and trailer in the slab, payloads apart.
	const hdr, pay, tail = 12, 64, 4
	zs := make([]byte, 8*(hdr+tail))
	var zrun []Packet
	for i := range 8 {
		full := testPayload(make([]byte, hdr+pay+tail), uint32(100+i), hdr+pay+tail)
		b := zs[i*(hdr+tail) : (i+1)*(hdr+tail) : (i+1)*(hdr+tail)]
		copy(b[:hdr], full[:hdr])
		copy(b[hdr:], full[hdr+pay:])
		zrun = append(zrun, Packet{Buf: b, Payload: full[hdr : hdr+pay], Addr: sockB})
	}
	if m, _ := a.buildSend(zrun, 0, a.txPort, a.tx.tos); m != 1 {
		t.Errorf("%d messages for 8 equal zero-copy packets, want 1", m)
	}
	// headers, then (payload, trailer+next headers) × 7, payload, trailer.
	if got := a.send.hdrs[0].Hdr.Iovlen; got != 1+2*8 {
		t.Errorf("%d iovecs for 8 zero-copy packets with adjacent headers, want %d", got, 1+2*8)
	}
	a.send.clearIovs(a.send.usedIovs)
	a.sendMu.Unlock()
	if err := a.Send(append(run, zrun...)); err != nil {
		t.Fatal(err)
	}
	got := recvN(t, b, len(run)+len(zrun), 5*time.Second)
	for i, p := range got {
		want := uint32(i)
		if i > n {
			want = uint32(100 + i - n - 1)
		}
		wb := testPayload(make([]byte, size), want, size)
		if want >= 100 {
			wb = testPayload(make([]byte, hdr+pay+tail), want, hdr+pay+tail)
		}
		if seqOf(p.Buf) != want || !bytes.Equal(p.Buf[:len(p.Buf)-4], wb[:len(wb)-4]) {
			t.Fatalf("packet %d: seq %d, %d bytes; want seq %d intact", i, seqOf(p.Buf), len(p.Buf), want)
		}
	}
}

// TestSocketRecvPrefix: a receive that drops a datagram before good ones
// leaves every slot with the buffer it was given, the packets it returns
// in theirs (CapRecvPrefix: transport restores only the slots returned in
// place). The plain path once swapped the dropped datagram's slot behind
// the good ones, so a slot past n held another slot's buffer.
func TestSocketRecvPrefix(t *testing.T) { forGRO(t, "", testSocketRecvPrefix) }

func testSocketRecvPrefix(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, nil, ob)
	if CapabilitiesOf(b)&CapRecvPrefix == 0 {
		t.Fatalf("socket link capabilities %v: no recv-prefix", CapabilitiesOf(b))
	}
	raw, err := net.ListenUDP("udp4", &net.UDPAddr{IP: sockA.AsSlice()})
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	dst := &net.UDPAddr{IP: sockB.AsSlice(), Port: Port}
	if _, err := raw.WriteToUDP(make([]byte, 11), dst); err != nil { // malformed: dropped
		t.Fatal(err)
	}
	if err := a.Send([]Packet{
		{Buf: testPayload(make([]byte, 64), 41, 64), Addr: sockB},
		{Buf: testPayload(make([]byte, 64), 42, 64), Addr: sockB},
	}); err != nil {
		t.Fatal(err)
	}
	pkts := recvBufs(8)
	orig := make([]*byte, len(pkts))
	for i := range pkts {
		orig[i] = &pkts[i].Buf[0]
	}
	var seqs []uint32
	for tries := 0; len(seqs) < 2 && tries < 5000; tries++ {
		n, err := b.TryRecv(pkts)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		for i := range n { // not in place: each in its own buffer
			seqs = append(seqs, seqOf(pkts[i].Buf))
			if c := cap(pkts[i].Buf); c != MaxPacketSize || &pkts[i].Buf[:1][0] != orig[i] {
				t.Fatalf("after a receive of %d: packet %d is not in its slot's buffer (cap %d)", n, i, c)
			}
		}
		for i := n; i < len(pkts); i++ {
			if c := cap(pkts[i].Buf); c != MaxPacketSize || &pkts[i].Buf[:1][0] != orig[i] {
				t.Fatalf("after a receive of %d: slot %d holds another buffer (cap %d)", n, i, c)
			}
		}
		for i := range n { // as transport does: its own buffers back
			pkts[i].Buf = unsafe.Slice(orig[i], MaxPacketSize)
		}
	}
	if len(seqs) != 2 || seqs[0] != 41 || seqs[1] != 42 {
		t.Fatalf("received seqs %v, want [41 42]", seqs)
	}
	if s := b.Stats(); s.DropMalformed != 1 {
		t.Errorf("stats %+v, want 1 malformed", s)
	}
}
