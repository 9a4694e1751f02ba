//go:build linux

package transport

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
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
