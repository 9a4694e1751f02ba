//go:build linux

package udp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/internal/netns"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// These tests run the transport over every Link backend across a veth pair
// between two network namespaces, and check on the veth what went over it.

// vethBackend is one Link configuration.
type vethBackend struct {
	name string
	open func(addr netip.Addr) (udp.Link, error)
}

var (
	// socketPlain: one datagram per packet (sendmmsg/recvmmsg), no GRO,
	// one source port per QP.
	socketPlain = vethBackend{"socket", func(a netip.Addr) (udp.Link, error) {
		return udp.ListenSocket(a, &udp.SocketOptions{NoGRO: true, SourcePorts: true})
	}}
	// socketGSO: UDP GSO on send, UDP GRO on receive.
	socketGSO = vethBackend{"socket-gso-gro", func(a netip.Addr) (udp.Link, error) {
		return udp.ListenSocket(a, &udp.SocketOptions{GSO: true})
	}}
	// raw: the raw IPv4 socket backend.
	rawBackend = vethBackend{"raw", func(a netip.Addr) (udp.Link, error) { return udp.ListenRaw(a, nil) }}
)

// vethCase is one pair of backends, A in the first namespace and B in the
// second.
type vethCase struct {
	name string
	a, b vethBackend
	// swSegment sets gso_max_segs 1 on the veth ends, so GSO datagrams
	// are segmented in software before they reach the wire, as for a NIC
	// without UDP segmentation offload. Without it a GSO datagram crosses
	// the veth whole and is split by the receiving socket (GRO) or its
	// socket layer.
	swSegment bool
	vethMTU   int           // 0: 1500
	mtu       transport.MTU // path MTU
}

func vethCases() []vethCase {
	return []vethCase{
		{name: "socket-socket", a: socketPlain, b: socketPlain, mtu: transport.MTU1024},
		{name: "gso-gso/offload-mtu4096", a: socketGSO, b: socketGSO, vethMTU: 9000, mtu: transport.MTU4096},
		{name: "gso-gso/sw-segmented", a: socketGSO, b: socketGSO, swSegment: true, mtu: transport.MTU1024},
		{name: "raw-raw", a: rawBackend, b: rawBackend, mtu: transport.MTU1024},
		{name: "raw-socket", a: rawBackend, b: socketPlain, mtu: transport.MTU1024},
		// A raw socket gets a GSO datagram that crosses a veth whole
		// (nobody splits it for raw sockets), so the GSO sender's veth
		// segments, as a real NIC's wire would.
		{name: "gso-raw/sw-segmented", a: socketGSO, b: rawBackend, swSegment: true, mtu: transport.MTU1024},
	}
}

// garbagePort is the UDP source port of the garbage datagrams; the
// capture check leaves them out.
const garbagePort = 5555

// TOS values the two QPs send with (A marks Congestion Experienced itself).
const (
	tosA = 0x20 | udp.ECNCE
	tosB = udp.ECNECT0
)

// TestVethRC runs RC transfers (SEND, SEND with immediate, WRITE, WRITE with
// immediate, READ of sizes from 0 to several packets and 64 KiB, and both
// atomics) between two transport devices in two namespaces, for each pair
// of backends. While it runs, garbage datagrams (short, random, RoCE-looking
// with a bad ICRC, to a wrong port) go to B. It checks:
//   - every completion (status, opcode, wr_id, byte_len, immediate) and every
//     byte (nothing written past a message; atomics' originals and target);
//   - an AF_PACKET capture of each veth end's outgoing packets holds exactly
//     the packets each link counted as sent, each a valid RoCEv2 packet
//     (packet.Parse) whose ICRC verifies over its real IP/UDP header
//     (icrc.Verify), with DF and the QP's TOS; a GSO datagram that crosses
//     the veth whole is cut into the segments the kernel would make, each
//     with its own IPv4 identification, and checked the same way;
//   - B dropped and counted exactly the garbage sent to port 4791, the
//     wrong-port datagrams never reached it, and no per-QP source port fell
//     back to 4791.
func TestVethRC(t *testing.T) {
	netns.Require(t)
	for _, vc := range vethCases() {
		t.Run(vc.name, func(t *testing.T) { testVethRC(t, vc) })
	}
}

func testVethRC(t *testing.T, vc vethCase) {
	np := udp.NewNetnsPair(t, vc.vethMTU)
	if vc.swSegment {
		for _, x := range [][2]string{{np.NsA, np.IfA}, {np.NsB, np.IfB}} {
			if out, err := exec.Command("ip", "-n", x[0], "link", "set", x[1], "gso_max_segs", "1").CombinedOutput(); err != nil {
				t.Fatalf("set gso_max_segs 1 on %s: %v: %s", x[1], err, out)
			}
		}
	}
	capA := startCapture(t, np.NsA, np.IfA)
	capB := startCapture(t, np.NsB, np.IfB)

	la := netns.MustGet(t, np.NsA, func() (udp.Link, error) { return vc.a.open(np.AddrA) })
	lb := netns.MustGet(t, np.NsB, func() (udp.Link, error) { return vc.b.open(np.AddrB) })
	a := newRCEnd(t, la)
	b := newRCEnd(t, lb)
	var release []func()
	closed := false
	closeAll := func() {
		if closed {
			return
		}
		closed = true
		// Devices first (no more packets), then registrations.
		a.dev.Close()
		b.dev.Close()
		for i := len(release) - 1; i >= 0; i-- {
			release[i]()
		}
	}
	defer closeAll()

	access := memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic
	psnA, psnB := uint32(0xfffff0), uint32(0x123456) // A's wraps during the run
	connectRC(t, a.qp, np.AddrB, b.qp.QPN(), psnA, psnB, vc.mtu, tosA, access)
	connectRC(t, b.qp, np.AddrA, a.qp.QPN(), psnB, psnA, vc.mtu, tosB, access)

	// Garbage for B, sent while the transfers run.
	g := newGarbage(t, np, vc)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	gdone := make(chan struct{})
	go func() { defer close(gdone); g.send(ctx) }()

	mtuBytes := vc.mtu.Bytes()
	for _, rc := range rcCases(mtuBytes) {
		if err := runRCCase(ctx, a, b, rc, &release); err != nil {
			// The counters tell a scheduling delay (ack_timeout_late),
			// kernel drops (link DropKernel) and a silent peer
			// (local_ack_timeout_err) apart.
			t.Fatalf("%s %d bytes x%d: %v\nA %+v\n  link %+v\nB %+v\n  link %+v", rc.name(), rc.size, rc.count, err,
				a.dev.Counters(), la.Stats(), b.dev.Counters(), lb.Stats())
		}
	}
	<-gdone
	if g.err != nil {
		t.Fatalf("sending garbage: %v", g.err)
	}
	// The garbage is counted by the time it is dropped; wait (bounded)
	// for the last of it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := lb.Stats()
		if s.DropMalformed+s.DropBadICRC >= uint64(g.malformed+g.badICRC) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A's last WRITE completed on the first ACK that covered it; an ACK B
	// sent after that one may still be on the veth. Wait (bounded) until
	// A has received everything B sent before closing the devices, so that
	// the counts compared below are final.
	for deadline := time.Now().Add(5 * time.Second); la.Stats().RcvdPkts < lb.Stats().SentPkts && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	closeAll()
	time.Sleep(20 * time.Millisecond)
	framesA, dropsA := capA.stop(t)
	framesB, dropsB := capB.stop(t)
	if dropsA+dropsB != 0 {
		t.Fatalf("the capture lost %d packets on %s and %d on %s: cannot check every packet", dropsA, np.IfA, dropsB, np.IfB)
	}

	sa, sb := la.Stats(), lb.Stats()
	t.Logf("A %s: %+v", vc.a.name, sa)
	t.Logf("B %s: %+v", vc.b.name, sb)
	ra := checkFrames(t, "A", framesA, np.AddrA, np.AddrB, tosA)
	rb := checkFrames(t, "B", framesB, np.AddrB, np.AddrA, tosB)
	t.Logf("capture: A sent %d packets (%d GSO datagrams seen whole, %d segments in them, %d with ID>0), B sent %d (%d GSO, %d segments, %d ID>0); max segment %d/%d bytes",
		ra.packets, ra.gso, ra.gsoSegs, ra.idNon0, rb.packets, rb.gso, rb.gsoSegs, rb.idNon0, ra.maxLen, rb.maxLen)
	if ra.packets != sa.SentPkts || rb.packets != sb.SentPkts {
		t.Errorf("captured %d packets from A and %d from B; the links sent %d and %d", ra.packets, rb.packets, sa.SentPkts, sb.SentPkts)
	}
	// A sends everything marked CE, but the notification points are off.
	if rb.cnps != 0 || ra.cnps != 0 {
		t.Errorf("CNPs: %d from B, %d from A; the notification points are off", rb.cnps, ra.cnps)
	}
	if c := b.dev.Counters(); c.NPECNMarkedRocePackets == 0 {
		t.Errorf("B counted no CE-marked packet (np_ecn_marked_roce_packets 0); A sends TOS %#x", tosA)
	}
	if sb.DropMalformed != uint64(g.malformed) || sb.DropBadICRC != uint64(g.badICRC) || sb.DropOther != 0 {
		t.Errorf("B dropped %d malformed, %d bad ICRC, %d other; garbage to port 4791: %d short, %d bad ICRC (and %d to a wrong port)",
			sb.DropMalformed, sb.DropBadICRC, sb.DropOther, g.malformed, g.badICRC, g.wrongPort)
	}
	if sa.DropMalformed+sa.DropBadICRC+sa.DropOther != 0 {
		t.Errorf("A dropped packets: %+v", sa)
	}
	if sa.RcvdPkts != sb.SentPkts {
		t.Errorf("A received %d packets, B sent %d (lost on the veth?)", sa.RcvdPkts, sb.SentPkts)
	}
	for _, l := range []udp.Link{la, lb} {
		if s, ok := l.(*udp.SocketLink); ok && s.SourcePortFallbacks() != 0 {
			t.Errorf("%v: %d per-QP source ports fell back to SendPort", s, s.SourcePortFallbacks())
		}
	}
	if vc.a.name == socketGSO.name && !vc.swSegment && ra.gso == 0 {
		t.Errorf("A sent with GSO but no GSO datagram crossed the veth")
	}
	if sl, ok := lb.(*udp.SocketLink); ok && vc.b.name == socketGSO.name && ra.gso > 0 && sl.GROCoalesced() == 0 {
		t.Errorf("%d GSO datagrams reached B's GRO socket whole, but it never received a coalesced buffer", ra.gso)
	}
	if vc.a.name == socketGSO.name && ra.idNon0 == 0 {
		t.Errorf("A sent with GSO but every packet had IPv4 ID 0 (no GSO group of 2 or more)")
	}
	for _, x := range []struct {
		be vethBackend
		r  capResult
	}{{vc.a, ra}, {vc.b, rb}} {
		if x.be.name != socketGSO.name && x.r.idNon0 != 0 {
			t.Errorf("%s sent %d packets with IPv4 ID != 0", x.be.name, x.r.idNon0)
		}
		if x.be.name != socketGSO.name && x.r.port4791 != 0 {
			t.Errorf("%s sent %d packets from port 4791, not the QP's source port", x.be.name, x.r.port4791)
		}
	}
	if vc.swSegment && ra.gso+rb.gso != 0 {
		t.Errorf("gso_max_segs 1, yet %d GSO datagrams crossed the veth whole", ra.gso+rb.gso)
	}
}

// rcEnd is one device with an RC QP.
type rcEnd struct {
	link     udp.Link
	dev      *transport.Device
	pd       *memreg.PD
	scq, rcq *transport.CQ
	qp       *transport.QP
}

func newRCEnd(t *testing.T, link udp.Link) *rcEnd {
	t.Helper()
	// No notification point: A sends everything marked CE (tosA), and B
	// would answer A's last packets with CNPs after the last completion,
	// past the comparison of the capture with the links' counters. The NP
	// is tested in transport (TestCNPWire), test/tshark and the interop
	// lab's CE cells.
	dev, err := transport.NewDevice(link, transport.DeviceConfig{Congestion: transport.CongestionConfig{DisableNP: true}})
	if err != nil {
		link.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	e := &rcEnd{link: link, dev: dev}
	if e.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if e.scq, err = dev.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	if e.rcq, err = dev.CreateCQ(1024); err != nil {
		t.Fatal(err)
	}
	e.qp, err = dev.CreateQP(e.pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: e.scq, RecvCQ: e.rcq,
		MaxSendWR: 256, MaxRecvWR: 256, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// connectRC takes qp to RTS towards the peer, with the attributes of
// rdma-core's tools (transport.DefaultRetry: timeout 14, retry 7,
// rnr_retry 7), sending with tos.
func connectRC(t *testing.T, qp *transport.QP, peer netip.Addr, peerQPN, sqPSN, rqPSN uint32, mtu transport.MTU, tos uint8, access memreg.Access) {
	t.Helper()
	if err := qp.Connect(transport.ConnParams{Peer: peer, TrafficClass: tos, DestQPN: peerQPN, RQPSN: rqPSN, SQPSN: sqPSN,
		PathMTU: mtu, Access: access, MaxRdAtomic: 16, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
}

// rcCase is count messages of one operation and size, all posted at once.
type rcCase struct {
	op    transport.WROpcode
	size  int
	count int
}

func (c rcCase) name() string { return c.op.String() }

// rcCases mixes every RC operation over sizes from empty to one path MTU
// exactly, several packets with a short last one, and 64 KiB.
func rcCases(mtu int) []rcCase {
	var cs []rcCase
	sizes := []int{0, 64, mtu, 3*mtu + 100, 65536}
	ops := []transport.WROpcode{transport.WRSend, transport.WRWrite, transport.WRRead, transport.WRSendImm, transport.WRWriteImm}
	for i, size := range sizes {
		for j := range ops {
			op := ops[(i+j)%len(ops)] // interleave operations
			cs = append(cs, rcCase{op, size, 6})
		}
		cs = append(cs, rcCase{[]transport.WROpcode{transport.WRCompareSwap, transport.WRFetchAdd}[i%2], 8, 6})
	}
	return cs
}

// runRCCase posts the case's work requests from A to B, waits for every
// completion and checks them and the memory. The memory stays registered
// until the functions appended to *release run (after the devices closed:
// late duplicates may still arrive).
func runRCCase(ctx context.Context, a, b *rcEnd, rc rcCase, release *[]func()) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	atomicOp := rc.op == transport.WRCompareSwap || rc.op == transport.WRFetchAdd
	span := max(rc.size, 1)
	if atomicOp {
		span = 8
	}
	total := span * rc.count
	// mmap'd, like the pinned memory a NIC reads behind the program's back
	// (the race detector cannot see the ordering through the network).
	alloc := func() ([]byte, error) {
		m, err := unix.Mmap(-1, 0, max(total, 1), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return nil, err
		}
		*release = append(*release, func() { unix.Munmap(m) })
		return m[:total], nil
	}
	src, err := alloc()
	if err != nil {
		return err
	}
	dst, err := alloc()
	if err != nil {
		return err
	}
	srcMR, err := a.pd.RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		return err
	}
	*release = append(*release, func() { srcMR.Deregister() })
	dstMR, err := b.pd.RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	if err != nil {
		return err
	}
	*release = append(*release, func() { dstMR.Deregister() })
	rng := rand.New(rand.NewPCG(uint64(rc.op)<<32|uint64(rc.size), 0x7665))
	from, to := src, dst // READ moves B's memory to A
	if rc.op == transport.WRRead {
		from, to = dst, src
	}
	for i := range from {
		from[i] = byte(rng.Uint32())
	}
	for i := range to {
		to[i] = 0xee
	}
	needRecv := rc.op == transport.WRSend || rc.op == transport.WRSendImm || rc.op == transport.WRWriteImm
	if needRecv {
		for i := range rc.count {
			wr := transport.RecvWR{WRID: uint64(i)}
			if rc.op != transport.WRWriteImm && rc.size > 0 {
				wr.SGEs = []memreg.SGE{{Addr: dstMR.IOVA() + uint64(i*span), Length: uint32(rc.size), LKey: dstMR.LKey()}}
			}
			if err := b.qp.PostRecv(wr); err != nil {
				return fmt.Errorf("post receive %d: %w", i, err)
			}
		}
	}
	var word uint64
	var wantOrig []uint64
	if atomicOp {
		word = rng.Uint64()
		binary.NativeEndian.PutUint64(dst[0:8], word)
	}
	cur := word
	wrs := make([]transport.SendWR, rc.count)
	for i := range wrs {
		wr := transport.SendWR{WRID: uint64(i), Opcode: rc.op, Flags: transport.SendSignaled,
			RemoteAddr: dstMR.IOVA() + uint64(i*span), RKey: dstMR.RKey(), Imm: 0x1000 + uint32(i)}
		if rc.size > 0 || atomicOp {
			wr.SGEs = []memreg.SGE{{Addr: srcMR.IOVA() + uint64(i*span), Length: uint32(rc.size), LKey: srcMR.LKey()}}
		}
		switch rc.op {
		case transport.WRCompareSwap:
			wr.RemoteAddr = dstMR.IOVA()
			next := rng.Uint64()
			wr.Swap = next
			wantOrig = append(wantOrig, cur)
			if i%3 == 2 { // a compare that fails
				wr.CompareAdd = cur ^ 1
			} else {
				wr.CompareAdd = cur
				cur = next
			}
		case transport.WRFetchAdd:
			wr.RemoteAddr = dstMR.IOVA()
			add := rng.Uint64() >> 8
			wr.CompareAdd = add
			wantOrig = append(wantOrig, cur)
			cur += add
		}
		wrs[i] = wr
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		return fmt.Errorf("post send: %w", err)
	}
	sendWCs, err := waitWCs(ctx, a.scq, rc.count)
	if err != nil {
		return err
	}
	wantOp := map[transport.WROpcode]transport.WCOpcode{transport.WRSend: transport.WCSend, transport.WRSendImm: transport.WCSend,
		transport.WRWrite: transport.WCRDMAWrite, transport.WRWriteImm: transport.WCRDMAWrite, transport.WRRead: transport.WCRDMARead,
		transport.WRCompareSwap: transport.WCCompSwap, transport.WRFetchAdd: transport.WCFetchAdd}[rc.op]
	for i, wc := range sendWCs {
		if wc.Status != transport.WCSuccess || wc.WRID != uint64(i) || wc.Opcode != wantOp {
			return fmt.Errorf("send completion %d: status %v wr_id %d opcode %v, want success, %d, %v", i, wc.Status, wc.WRID, wc.Opcode, i, wantOp)
		}
	}
	if needRecv {
		recvWCs, err := waitWCs(ctx, b.rcq, rc.count)
		if err != nil {
			return err
		}
		for i, wc := range recvWCs {
			want := transport.WCRecv
			if rc.op == transport.WRWriteImm {
				want = transport.WCRecvRDMAImm
			}
			imm := rc.op != transport.WRSend
			if wc.Status != transport.WCSuccess || wc.WRID != uint64(i) || wc.Opcode != want || wc.ByteLen != uint32(rc.size) ||
				(wc.Flags&transport.WCWithImm != 0) != imm || (imm && wc.Imm != 0x1000+uint32(i)) ||
				wc.QPN != b.qp.QPN() || wc.SrcQP != a.qp.QPN() {
				return fmt.Errorf("receive completion %d: %+v", i, wc)
			}
		}
	}
	if atomicOp {
		for i, want := range wantOrig {
			if got := binary.NativeEndian.Uint64(src[i*8:]); got != want {
				return fmt.Errorf("atomic %d returned %#016x, want %#016x", i, got, want)
			}
		}
		if got := binary.NativeEndian.Uint64(dst[0:8]); got != cur {
			return fmt.Errorf("target %#016x after %d atomics, want %#016x", got, rc.count, cur)
		}
		return nil
	}
	for i := range rc.count {
		lo, hi := i*span, i*span+rc.size
		if !bytes.Equal(from[lo:hi], to[lo:hi]) {
			return fmt.Errorf("message %d: data differs", i)
		}
		for j := hi; j < (i+1)*span; j++ {
			if to[j] != 0xee {
				return fmt.Errorf("message %d: byte %d past the end was written", i, j-lo)
			}
		}
	}
	return nil
}

// waitWCs collects n completions from cq.
func waitWCs(ctx context.Context, cq *transport.CQ, n int) ([]transport.WC, error) {
	out := make([]transport.WC, 0, n)
	buf := make([]transport.WC, 64)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf)
		if err != nil {
			return out, fmt.Errorf("waiting for completion %d of %d: %w", len(out)+1, n, err)
		}
		out = append(out, buf[:k]...)
	}
	return out, nil
}

// garbage is the junk a test sends to B from a plain UDP socket in A's
// namespace (source port garbagePort).
type garbage struct {
	conn      *net.UDPConn
	dst       netip.Addr
	pkts      [][]byte
	ports     []int
	malformed int // to 4791, shorter than BTH+ICRC
	badICRC   int // to 4791, long enough, ICRC wrong
	wrongPort int // to 4790 and 4792
	err       error
}

func newGarbage(t *testing.T, np *netns.Pair, vc vethCase) *garbage {
	t.Helper()
	conn := netns.MustGet(t, np.NsA, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp4", &net.UDPAddr{IP: np.AddrA.AsSlice(), Port: garbagePort})
	})
	t.Cleanup(func() { conn.Close() })
	g := &garbage{conn: conn, dst: np.AddrB}
	rng := rand.New(rand.NewPCG(5, 55))
	add := func(b []byte, port int) {
		g.pkts = append(g.pkts, b)
		g.ports = append(g.ports, port)
	}
	for i := range 60 {
		switch i % 5 {
		case 0: // short
			add(make([]byte, rng.IntN(16)), udp.Port)
			g.malformed++
		case 1, 2: // random bytes
			b := make([]byte, 16+rng.IntN(1400))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			add(b, udp.Port)
			g.badICRC++
		case 3: // a RoCE-looking SEND with a wrong ICRC
			b := make([]byte, 12+64+4)
			b[0], b[2], b[3] = 0x04, 0xff, 0xff
			binary.BigEndian.PutUint32(b[4:], 0x11) // DestQP 0x11
			icrc.Store(b, rng.Uint32())
			add(b, udp.Port)
			g.badICRC++
		case 4: // wrong destination port
			b := make([]byte, 16+rng.IntN(200))
			add(b, udp.Port-1+2*(i%2))
			g.wrongPort++
		}
	}
	return g
}

// send sends the garbage, one datagram per millisecond.
func (g *garbage) send(ctx context.Context) {
	for i, b := range g.pkts {
		if ctx.Err() != nil {
			g.err = ctx.Err()
			return
		}
		if _, err := g.conn.WriteToUDPAddrPort(b, netip.AddrPortFrom(g.dst, uint16(g.ports[i]))); err != nil {
			g.err = err
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// capture records the IPv4 packets a veth end sends (PACKET_OUTGOING: only
// ETH_P_ALL sockets see those), before the peer end could drop any,
// with the virtio-net header that tells whether a packet is a GSO datagram.
type capture struct {
	fd     int
	halt   atomic.Bool
	done   chan struct{}
	mu     sync.Mutex
	frames []capFrame
	err    error
}

// capFrame is one captured IPv4 packet and its GSO metadata.
type capFrame struct {
	gsoType uint8
	gsoSize uint16
	ip      []byte
}

const (
	vnetHdrLen      = 10 // struct virtio_net_hdr
	vnetGSONone     = 0
	vnetGSOUDPL4    = 5 // VIRTIO_NET_HDR_GSO_UDP_L4
	ethHdrLen       = 14
	packetVnetHdrOp = 15 // PACKET_VNET_HDR
)

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startCapture opens an AF_PACKET socket on ifname in namespace ns and
// records its outgoing IPv4 packets until stop.
func startCapture(t *testing.T, ns, ifname string) *capture {
	t.Helper()
	fd := netns.MustGet(t, ns, func() (int, error) {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return -1, err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return -1, err
		}
		fail := func(err error) (int, error) { unix.Close(fd); return -1, err }
		if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, packetVnetHdrOp, 1); err != nil {
			return fail(fmt.Errorf("PACKET_VNET_HDR: %w", err))
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20); err != nil {
			return fail(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return fail(err)
		}
		tv := unix.Timeval{Usec: 20000}
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fail(err)
		}
		return fd, nil
	})
	c := &capture{fd: fd, done: make(chan struct{})}
	go c.run()
	t.Cleanup(func() { c.halt.Store(true); <-c.done; unix.Close(fd) })
	return c
}

func (c *capture) run() {
	defer close(c.done)
	buf := make([]byte, 1<<17)
	for !c.halt.Load() {
		n, from, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype != unix.PACKET_OUTGOING || n < vnetHdrLen+ethHdrLen+28 {
			continue
		}
		if binary.BigEndian.Uint16(buf[vnetHdrLen+12:]) != unix.ETH_P_IP {
			continue
		}
		ip := buf[vnetHdrLen+ethHdrLen : n]
		if ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_UDP {
			continue
		}
		ihl := int(ip[0]&0xf) * 4
		if len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl+2:]) != udp.Port || binary.BigEndian.Uint16(ip[ihl:]) == garbagePort {
			continue
		}
		c.mu.Lock()
		c.frames = append(c.frames, capFrame{gsoType: buf[1], gsoSize: binary.NativeEndian.Uint16(buf[4:6]), ip: bytes.Clone(ip)})
		c.mu.Unlock()
	}
}

// stop drains the socket, ends the capture and returns the frames and the
// kernel's count of packets the socket dropped.
func (c *capture) stop(t *testing.T) ([]capFrame, uint32) {
	t.Helper()
	time.Sleep(50 * time.Millisecond) // > SO_RCVTIMEO: the queue is read
	c.halt.Store(true)
	<-c.done
	st, err := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		t.Fatalf("capture: %v", c.err)
	}
	return c.frames, st.Drops
}

// capResult sums what checkFrames saw.
type capResult struct {
	packets  uint64 // RoCEv2 packets (GSO datagrams counted by segment)
	gso      int    // GSO datagrams that crossed the veth whole
	gsoSegs  int    // segments in them
	maxLen   int    // largest UDP payload of a packet
	idNon0   int    // packets with an IPv4 identification other than 0 (GSO segments after the first)
	port4791 int    // packets from UDP source port 4791 (not a per-QP port)
	cnps     int    // CNPs (sent with DSCP 48, Not-ECT, instead of the QP's TOS)
}

// checkFrames checks every captured packet a link at src sent to dst (see
// TestVethRC) and returns the counts; failures are test errors (the first
// 10).
func checkFrames(t *testing.T, who string, frames []capFrame, src, dst netip.Addr, tos uint8) capResult {
	t.Helper()
	var r capResult
	bad := 0
	fail := func(format string, args ...any) {
		bad++
		if bad <= 10 {
			t.Errorf(who+": "+format, args...)
		}
	}
	seg := make([]byte, 0, 65536)
	for fi, f := range frames {
		ip := f.ip
		if ip[0] != 0x45 || int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
			fail("frame %d: IPv4 header %x, length %d", fi, ip[:4], len(ip))
			continue
		}
		if netip.AddrFrom4([4]byte(ip[12:16])) != src || netip.AddrFrom4([4]byte(ip[16:20])) != dst {
			fail("frame %d: %v -> %v", fi, netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])))
			continue
		}
		payload := ip[28:]
		segSize := len(payload)
		if f.gsoType != vnetGSONone {
			if f.gsoType != vnetGSOUDPL4 || f.gsoSize == 0 {
				fail("frame %d: GSO type %d size %d", fi, f.gsoType, f.gsoSize)
				continue
			}
			segSize = int(f.gsoSize)
			r.gso++
		}
		id := binary.BigEndian.Uint16(ip[4:6])
		for off, k := 0, 0; off < len(payload); off, k = off+segSize, k+1 {
			chunk := payload[off:min(off+segSize, len(payload))]
			// The segment as the kernel makes it: the same headers with its
			// own lengths and the identification counted up.
			seg = append(append(seg[:0], ip[:28]...), chunk...)
			binary.BigEndian.PutUint16(seg[2:], uint16(len(seg)))
			binary.BigEndian.PutUint16(seg[4:], id+uint16(k))
			binary.BigEndian.PutUint16(seg[24:], uint16(8+len(chunk)))
			if f.gsoType != vnetGSONone {
				r.gsoSegs++
			}
			r.packets++
			r.maxLen = max(r.maxLen, len(chunk))
			if id+uint16(k) != 0 {
				r.idNon0++
			}
			if binary.BigEndian.Uint16(seg[20:]) == udp.Port {
				r.port4791++
			}
			if err := icrc.Verify(seg); err != nil {
				fail("frame %d segment %d (%d bytes, ID %d): %v", fi, k, len(chunk), id+uint16(k), err)
			}
			var p packet.Packet
			if err := p.Parse(seg[28:]); err != nil {
				fail("frame %d segment %d: not RoCEv2: %v", fi, k, err)
			}
			want := tos
			if p.BTH.Opcode() == bth.CNP {
				want = 48 << 2 // the notification point's CNP: DSCP 48, Not-ECT
				r.cnps++
			}
			if ff := binary.BigEndian.Uint16(seg[6:]); ff != 0x4000 || seg[1] != want || seg[8] != 64 {
				fail("frame %d segment %d: flags %#04x TOS %#02x TTL %d, want DF, %#02x, 64", fi, k, ff, seg[1], seg[8], want)
			}
		}
	}
	if bad > 10 {
		t.Errorf("%s: %d more bad packets", who, bad-10)
	}
	return r
}

// TestVethECN sends packets marked with each TOS/ECN value, among them CE,
// from every backend to every backend across the veth (GSO runs included):
// the receiving link reports the TOS byte as sent, for every packet.
func TestVethECN(t *testing.T) {
	np := udp.NewNetnsPair(t, 0)
	bes := []vethBackend{socketPlain, socketGSO, rawBackend}
	for _, sb := range bes {
		for _, rb := range bes {
			t.Run(sb.name+"-"+rb.name, func(t *testing.T) {
				la := netns.MustGet(t, np.NsA, func() (udp.Link, error) { return sb.open(np.AddrA) })
				defer la.Close()
				lb := netns.MustGet(t, np.NsB, func() (udp.Link, error) { return rb.open(np.AddrB) })
				defer lb.Close()
				// Runs of equal packets (one GSO datagram each from the GSO
				// sender); gso_max_segs keeps the veth from passing them
				// whole when the receiver is raw.
				if rb.name == rawBackend.name {
					exec.Command("ip", "-n", np.NsA, "link", "set", np.IfA, "gso_max_segs", "1").Run()
					defer exec.Command("ip", "-n", np.NsA, "link", "set", np.IfA, "gso_max_segs", "65535").Run()
				}
				var out []udp.Packet
				tosList := []uint8{udp.ECNCE, 0xb8 | udp.ECNCE, udp.ECNECT0, udp.ECNECT1, 0, 0x48 | udp.ECNCE}
				for i, tos := range tosList {
					for k := range 8 {
						b := make([]byte, 512)
						b[0] = 0x04 // RC SEND only
						binary.BigEndian.PutUint32(b[8:], uint32(i*8+k))
						out = append(out, udp.Packet{Buf: b, Addr: np.AddrB, SrcPort: 0xc001, TOS: tos})
					}
				}
				if err := la.Send(out); err != nil {
					t.Fatal(err)
				}
				in := make([]udp.Packet, 64)
				got := 0
				deadline := time.Now().Add(5 * time.Second)
				for got < len(out) && time.Now().Before(deadline) {
					for i := range in {
						in[i].Buf = make([]byte, udp.MaxPacketSize)
					}
					n, err := recvTimeout(lb, in, time.Until(deadline))
					if err != nil {
						t.Fatal(err)
					}
					for _, p := range in[:n] {
						seq := binary.BigEndian.Uint32(p.Buf[8:]) & 0xffffff
						if want := tosList[seq/8]; p.TOS != want {
							t.Errorf("packet %d: TOS %#02x received, %#02x sent", seq, p.TOS, want)
						}
						got++
					}
				}
				if got != len(out) {
					t.Fatalf("received %d of %d packets (%+v)", got, len(out), lb.Stats())
				}
			})
		}
	}
}

// recvTimeout is l.Recv, giving up (with an error) after d.
func recvTimeout(l udp.Link, pkts []udp.Packet, d time.Duration) (int, error) {
	type res struct {
		n   int
		err error
	}
	ch := make(chan res, 1)
	go func() { n, err := l.Recv(pkts); ch <- res{n, err} }()
	select {
	case r := <-ch:
		return r.n, r.err
	case <-time.After(d):
		l.Close()
		<-ch
		return 0, fmt.Errorf("no packet within %v", d)
	}
}
