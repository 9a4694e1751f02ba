//go:build linux

package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// TestBadICRCNeverPlaced is the property of verify-then-place: no byte of
// a packet whose ICRC fails ever reaches registered memory. A plain UDP
// socket plays the peer of a device on a SocketLink and sends it RDMA
// WRITEs with the expected PSN, a valid RETH into a registered region and
// a payload unlike the region's bytes — each with one random bit flipped
// somewhere in BTH .. ICRC (never in BTH byte 4, which the ICRC masks) —
// as UDP GSO trains (received coalesced, handed out in place, the path
// that defers the ICRC check to the device) and as single datagrams. The
// region must stay as it was and every packet must count as a bad ICRC;
// then one intact WRITE must be placed (the setup can place). Both with
// the check deferred to the device (the default) and in the link's Recv.
//
// Over IPv4 a UDP socket cannot see the identification and solves for it
// (udp.SocketLink): the check is 16 bits weaker than the full ICRC, and
// the seeded flips here are all caught.
func TestBadICRCNeverPlaced(t *testing.T) {
	for _, inLink := range []bool{false, true} {
		t.Run(map[bool]string{false: "deferred", true: "in-link"}[inLink], func(t *testing.T) {
			testBadICRCNeverPlaced(t, inLink)
		})
	}
}

func testBadICRCNeverPlaced(t *testing.T, inLink bool) {
	pid := os.Getpid()
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	last := byte(81)
	if inLink {
		last = 83
	}
	addrA, addrB := netip.AddrFrom4([4]byte{127, b1, b2, last}), netip.AddrFrom4([4]byte{127, b1, b2, last + 1})
	l, err := udp.ListenSocket(addrB, &udp.SocketOptions{})
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Skipf("UDP %v:4791 unavailable: %v", addrB, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dev, err := NewDevice(l, DeviceConfig{VerifyInLink: inLink})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	if got := dev.rx.verify != nil; got == inLink {
		t.Fatalf("device defers the ICRC check: %v, want %v", got, !inLink)
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	const psn, peerQPN, mtu = 100, 0x77, 1024
	if err := qp.Connect(ConnParams{Peer: addrA, DestQPN: peerQPN, RQPSN: psn, SQPSN: 0, PathMTU: MTU1024,
		Access: memreg.AccessRemoteWrite}); err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 64<<10)
	for i := range mem {
		mem[i] = 0xaa
	}
	pristine := bytes.Clone(mem)
	mr, err := pd.RegisterMR(mem, memreg.AccessRemoteWrite|memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addrA.As4()}); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	sport := uint16(sa.(*unix.SockaddrInet4).Port)
	to := &unix.SockaddrInet4{Port: udp.Port, Addr: addrB.As4()}

	// write builds WRITE_ONLY of mtu bytes of v at offset off of the
	// region with the expected PSN, its ICRC for IPv4 identification id.
	write := func(off int, v byte, id uint16) []byte {
		payload := bytes.Repeat([]byte{v}, mtu)
		f := packet.Fields{}
		f.BTH.Opcode = bth.RCWriteOnly
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = qp.QPN()
		f.BTH.PSN = psn
		f.BTH.AckReq = true
		f.RETH.VA = mr.IOVA() + uint64(off)
		f.RETH.RKey = mr.RKey()
		f.RETH.DMALength = mtu
		f.Payload = payload
		buf := make([]byte, packet.Len(f.BTH.Opcode, mtu))
		if _, err := packet.Build(buf, &f); err != nil {
			t.Fatal(err)
		}
		icrc.Store(buf, udp.ComputeICRC(addrA, addrB, sport, id, buf))
		return buf
	}
	r := rand.New(rand.NewPCG(51, 52))
	corrupt := func(b []byte) {
		for {
			i := r.IntN(len(b))
			if i == 4 { // BTH byte 4: masked by the ICRC
				continue
			}
			b[i] ^= 1 << r.IntN(8)
			return
		}
	}
	sent := 0
	for round := range 24 {
		segs := 1
		if round%3 != 0 {
			segs = 2 + r.IntN(15) // a GSO train, received coalesced
		}
		var train []byte
		for k := range segs {
			b := write(r.IntN(len(mem)/mtu)*mtu, byte(1+r.IntN(200)), uint16(k))
			corrupt(b)
			train = append(train, b...)
		}
		var oob []byte
		if segs > 1 {
			oob = make([]byte, unix.CmsgSpace(2))
			h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
			h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
			h.SetLen(unix.CmsgLen(2))
			binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(len(train)/segs))
		}
		if err := unix.Sendmsg(fd, train, oob, to, 0); err != nil {
			t.Fatalf("sendmsg of %d segments: %v", segs, err)
		}
		sent += segs
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().DropBadICRC < uint64(sent) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	check := func() bool {
		qp.mu.Lock() // the placement happens under it: the race detector's order
		defer qp.mu.Unlock()
		return bytes.Equal(mem, pristine)
	}
	if !check() {
		t.Fatal("bytes of a packet whose ICRC failed were placed in registered memory")
	}
	if s := l.Stats(); s.DropBadICRC != uint64(sent) || s.RcvdPkts != 0 {
		t.Fatalf("link stats %+v, want %d bad ICRCs and nothing received", s, sent)
	}
	// The same WRITE intact is placed.
	if err := unix.Sendto(fd, write(0, 0x55, 0), 0, to); err != nil {
		t.Fatal(err)
	}
	for check() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	if !bytes.Equal(mem[:mtu], bytes.Repeat([]byte{0x55}, mtu)) || !bytes.Equal(mem[mtu:], pristine[mtu:]) {
		t.Fatal("the intact WRITE was not placed (or placed wrongly)")
	}
}

// wireRecorder records the datagrams a device sends as they go on the
// wire (zero-copy ones put together), without their ICRC (it covers the
// link's ephemeral source port), and without ACKs (their coalescing
// depends on timing).
type wireRecorder struct {
	udp.Wrap
	mu   sync.Mutex
	pkts [][]byte
}

func (w *wireRecorder) Send(pkts []udp.Packet) error {
	w.mu.Lock()
	for i := range pkts {
		if bth.Opcode(pkts[i].Buf[0]) != bth.RCAck {
			b := pkts[i].AppendWire(nil)
			w.pkts = append(w.pkts, b[:len(b)-icrc.Size])
		}
	}
	w.mu.Unlock()
	return w.Link.Send(pkts)
}

// TestZeroCopyWireIdentical: WRITEs, SENDs and READs (multi-packet, an
// odd length with pad bytes, a payload spanning two SGEs, which is copied)
// between devices on SocketLinks put the same bytes on the wire with
// zero-copy send as with CopySend, the data arrives intact, and the
// zero-copy run did send from registered memory.
func TestZeroCopyWireIdentical(t *testing.T) {
	pid := os.Getpid()
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	run := func(copySend bool, last byte) (wire [][]byte, zcSent int) {
		addrA, addrB := netip.AddrFrom4([4]byte{127, b1, b2, last}), netip.AddrFrom4([4]byte{127, b1, b2, last + 1})
		po := pairOpts{mtu: MTU4096}
		po.defaults()
		var recs []*wireRecorder
		mk := func(addr netip.Addr, qpn uint32) *side {
			// Unshared: FirstQPN numbers the QPs (a shared link's
			// come from its leases), so both runs' bytes match.
			l, err := udp.ListenSocket(addr, &udp.SocketOptions{GSO: true, Share: udp.ShareOff})
			if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL) {
				t.Skipf("UDP %v:4791 unavailable: %v", addr, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			rec := &wireRecorder{Wrap: udp.Wrap{Link: l, PassPayload: true}}
			recs = append(recs, rec)
			dev, err := NewDevice(rec, DeviceConfig{CopySend: copySend, FirstQPN: qpn})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { dev.Close() })
			if dev.zc == copySend {
				t.Fatalf("device zero-copy %v with CopySend %v", dev.zc, copySend)
			}
			pd, _ := dev.AllocPD()
			scq, _ := dev.CreateCQ(256)
			rcq, _ := dev.CreateCQ(256)
			qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: rcq, MaxSendWR: 64, MaxRecvWR: 64, MaxSGE: 4})
			if err != nil {
				t.Fatal(err)
			}
			return &side{dev: dev, pd: pd, scq: scq, rcq: rcq, qp: qp}
		}
		a, r := mk(addrA, 0x100), mk(addrB, 0x200)
		connect(t, a, r, addrB, 0x10, 0x20, &po)
		connect(t, r, a, addrA, 0x20, 0x10, &po)
		const size = 3*4096 + 1001 // pad bytes in the last packet
		// Fixed IOVAs: the RETHs carry them, the same in both runs.
		reg := func(s *side, n int, iova uint64, acc memreg.Access) ([]byte, *memreg.MR) {
			buf := make([]byte, n)
			mr, err := s.pd.RegisterMRIOVA(buf, iova, acc|memreg.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			return buf, mr
		}
		src, smr := reg(a, 2*size, 0x10000, 0)
		fill(src, 7)
		dst, dmr := reg(r, 2*size, 0x20000, memreg.AccessRemoteWrite|memreg.AccessRemoteRead)
		back, bmr := reg(a, size, 0x40000, 0)
		for range 2 {
			if err := r.qp.PostRecv(RecvWR{SGEs: sge(dmr, size, size)}); err != nil {
				t.Fatal(err)
			}
		}
		split := []memreg.SGE{{Addr: smr.IOVA(), Length: 5000, LKey: smr.LKey()}, {Addr: smr.IOVA() + 5000, Length: size - 5000, LKey: smr.LKey()}}
		wrs := []SendWR{
			{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
			{Opcode: WRSend, Flags: SendSignaled, SGEs: split},
			{Opcode: WRRead, Flags: SendSignaled, SGEs: sge(bmr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
			{Opcode: WRSendImm, Flags: SendSignaled, SGEs: sge(smr, size, 8), Imm: 9},
		}
		for _, wr := range wrs {
			if err := a.qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			for _, wc := range waitWC(t, a.scq, 1, 10*time.Second) {
				if wc.Status != WCSuccess {
					t.Fatalf("%v: %+v", wr.Opcode, wc)
				}
			}
		}
		waitWC(t, r.rcq, 2, 10*time.Second)
		r.qp.mu.Lock()
		ok := bytes.Equal(dst[:size], src[:size]) && bytes.Equal(back, src[:size])
		r.qp.mu.Unlock()
		if !ok {
			t.Fatal("data arrived changed")
		}
		for _, rec := range recs {
			rec.mu.Lock()
			wire = append(wire, rec.pkts...)
			rec.mu.Unlock()
		}
		return wire, int(a.dev.ctr.SentPkts)
	}
	zcWire, _ := run(false, 91)
	cpWire, _ := run(true, 93)
	// Keyed by opcode and PSN (a retransmission under load sends the same
	// bytes again), with the R_Key, whose key byte each registration
	// draws anew, masked.
	key := func(w [][]byte) map[string][]byte {
		m := map[string][]byte{}
		for _, b := range w {
			b = bytes.Clone(b)
			switch bth.Opcode(b[0]) {
			case bth.RCWriteFirst, bth.RCWriteOnly, bth.RCWriteOnlyImm, bth.RCReadRequest:
				clear(b[bth.Size+8 : bth.Size+12])
			}
			m[fmt.Sprintf("%02x/%d", b[0], binary.BigEndian.Uint32(b[8:12])&0xffffff)] = b
		}
		return m
	}
	zk, ck := key(zcWire), key(cpWire)
	if len(zk) != len(ck) || len(zk) < 10 {
		t.Fatalf("zero-copy run sent %d distinct packets, copying run %d", len(zk), len(ck))
	}
	for k, b := range zk {
		if !bytes.Equal(b, ck[k]) {
			t.Fatalf("packet %s differs between zero-copy and copying sends", k)
		}
	}
}

// TestAllocsPerMessageSocket: on SocketLinks with GSO — zero-copy send
// and the ICRC check deferred to the device — 64 KiB WRITEs, READs and
// SENDs allocate nothing in steady state.
func TestAllocsPerMessageSocket(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	pid := os.Getpid()
	b1, b2 := byte(40+pid%200), byte(1+(pid/200)%250)
	a, r := newSocketPairAt(t, &udp.SocketOptions{GSO: true}, netip.AddrFrom4([4]byte{127, b1, b2, 95}), netip.AddrFrom4([4]byte{127, b1, b2, 96}))
	if !a.dev.zc || r.dev.rx.verify == nil {
		t.Fatalf("zero-copy %v, deferred verification %v: the paths under test are off", a.dev.zc, r.dev.rx.verify != nil)
	}
	const size = 1 << 16
	_, smr := a.buffer(t, size, memreg.AccessLocalWrite)
	_, dmr := r.buffer(t, size, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessLocalWrite)
	wrs := []SendWR{
		{Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		{Opcode: WRRead, Flags: SendSignaled, SGEs: sge(smr, 0, size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
		{Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 0, size)},
	}
	recv := RecvWR{SGEs: sge(dmr, 0, size)}
	wc := make([]WC, 1)
	ctx := context.Background()
	one := func() {
		if err := r.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		for i := range wrs {
			if err := a.qp.PostSend(wrs[i]); err != nil {
				t.Fatal(err)
			}
			if _, err := a.scq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
				t.Fatal(err, wc[0])
			}
		}
		if _, err := r.rcq.Wait(ctx, wc); err != nil || wc[0].Status != WCSuccess {
			t.Fatal(err, wc[0])
		}
	}
	for range 50 {
		one()
	}
	allocs := testing.AllocsPerRun(100, one)
	t.Logf("allocations per 64 KiB WRITE+READ+SEND round: %.2f", allocs)
	if allocs > 1 {
		t.Errorf("%.2f allocations per round in steady state, want ~0", allocs)
	}
}
