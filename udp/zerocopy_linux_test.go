//go:build linux

package udp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

// zcPacket returns a RoCEv2 SEND_ONLY packet with sequence seq and n
// payload bytes twice: whole (BTH, payload, pad, ICRC room) and split
// as a zero-copy send gives it (Buf: BTH, pad, ICRC room; Payload: the
// payload, in a "region" of its own).
func zcPacket(seq uint32, n int, dst netip.Addr) (whole []byte, split Packet) {
	pad := -n & 3
	whole = make([]byte, 12+n+pad+4)
	whole[0] = 0x04
	whole[1] = byte(pad) << 4
	binary.BigEndian.PutUint16(whole[2:4], 0xffff)
	binary.BigEndian.PutUint32(whole[4:8], 0x12)
	binary.BigEndian.PutUint32(whole[8:12], seq&0xffffff)
	for i := range n {
		whole[12+i] = byte(seq*7) + byte(i*13)
	}
	region := make([]byte, n+64) // the payload sits inside a larger region
	payload := region[32 : 32+n : 32+n]
	copy(payload, whole[12:12+n])
	buf := make([]byte, 0, 12+pad+4)
	buf = append(buf, whole[:12]...)
	buf = append(buf, whole[12+n:]...)
	return whole, Packet{Buf: buf, Payload: payload, Addr: dst}
}

// TestZeroCopySendWire: packets sent with their payload outside Buf
// (Packet.Payload) arrive byte for byte as the same packets sent whole,
// mixed in one batch, with and without GSO, and their ICRCs verify; the
// wire bytes of a zero-copy send are those of a copying one.
func TestZeroCopySendWire(t *testing.T) {
	for _, gso := range []bool{false, true} {
		t.Run(map[bool]string{false: "sendmmsg", true: "GSO"}[gso], func(t *testing.T) {
			a, b := listenPairOpts(t, &SocketOptions{GSO: gso}, &SocketOptions{})
			if !a.ZeroCopy() || CapabilitiesOf(a)&CapZeroCopy == 0 {
				t.Fatalf("SocketLink: ZeroCopy %v, capabilities %v", a.ZeroCopy(), CapabilitiesOf(a))
			}
			sizes := []int{4096, 4096, 4096, 4096, 4093, 1, 2, 3, 0, 1024, 1024, 1021, 300}
			var pkts []Packet
			var want [][]byte
			for i := range 3 * len(sizes) {
				n := sizes[i%len(sizes)]
				whole, split := zcPacket(uint32(i), n, sockB)
				want = append(want, whole)
				if i%3 == 1 { // every third whole: mixed in the same GSO runs
					pkts = append(pkts, Packet{Buf: bytes.Clone(whole), Addr: sockB})
				} else {
					pkts = append(pkts, split)
				}
			}
			if err := a.Send(pkts); err != nil {
				t.Fatal(err)
			}
			got := recvN(t, b, len(pkts), 10*time.Second)
			for i, p := range got {
				w := want[seqOf(p.Buf)]
				copy(w[len(w)-4:], p.Buf[len(p.Buf)-4:]) // the ICRC the link filled (checked by the receiver)
				if seqOf(p.Buf) != uint32(i) || !bytes.Equal(p.Buf, w) {
					t.Fatalf("packet %d (seq %d): got %d bytes, want %d: wire bytes differ", i, seqOf(p.Buf), len(p.Buf), len(w))
				}
			}
			if s := b.Stats(); s.DropBadICRC != 0 || s.RcvdPkts != uint64(len(pkts)) {
				t.Errorf("receiver stats %+v", s)
			}
		})
	}
}

// TestZeroCopyRefusedWithout: a link without zero-copy send (NoZeroCopy,
// RawLink, the exported CheckSend of out-of-package links) refuses a
// packet with Payload set instead of sending it without its payload.
func TestZeroCopyRefusedWithout(t *testing.T) {
	a, _ := listenPairOpts(t, &SocketOptions{NoZeroCopy: true}, nil)
	_, split := zcPacket(1, 100, sockB)
	if a.ZeroCopy() || CapabilitiesOf(a)&CapZeroCopy != 0 {
		t.Fatalf("NoZeroCopy link reports zero-copy")
	}
	if err := a.Send([]Packet{split}); !errors.Is(err, ErrPayload) {
		t.Errorf("Send of a split packet on a NoZeroCopy link: %v, want ErrPayload", err)
	}
	if err := CheckSend([]Packet{split}, sockA); !errors.Is(err, ErrPayload) {
		t.Errorf("CheckSend of a split packet: %v, want ErrPayload", err)
	}
	// A wrapper forwards zero-copy only when it says it passes payloads.
	z := zcFake{a}
	if CapabilitiesOf(Wrap{Link: z})&CapZeroCopy != 0 || (Wrap{Link: z}).ZeroCopy() {
		t.Errorf("Wrap without PassPayload forwards zero-copy")
	}
	if CapabilitiesOf(Wrap{Link: z, PassPayload: true})&CapZeroCopy == 0 {
		t.Errorf("Wrap with PassPayload does not forward zero-copy")
	}
}

// zcFake is a link that claims zero-copy send.
type zcFake struct{ Link }

func (zcFake) ZeroCopy() bool { return true }

// TestZeroCopyChangeAfterICRC is the property of zero-copy send's
// contract (a region must not change while a work request reading it is
// outstanding): a payload changed after the link computed its ICRC and
// before the kernel copied it is never delivered — the receiver's ICRC
// check fails and counts it — while every unchanged packet arrives
// intact. The changes are random bursts of 1..4 bytes (within 32 bits:
// CRC-32 detects every such burst) at random offsets of random packets,
// over IPv4 with and without GSO and over IPv6.
//
// Over IPv4 a UDP socket receiver does not see the identification and
// solves for it, so its check is 16 bits weaker (SocketLink's doc); the
// seeded changes here are all caught, and IPv6 checks the full 32 bits.
func TestZeroCopyChangeAfterICRC(t *testing.T) {
	type cfg struct {
		name string
		gso  bool
		v6   bool
	}
	for _, c := range []cfg{{"IPv4", false, false}, {"IPv4-GSO", true, false}, {"IPv6-GSO", true, true}} {
		t.Run(c.name, func(t *testing.T) {
			var a, b *SocketLink
			dst := sockB
			if c.v6 {
				a = listenLoopback6(t, &SocketOptions{GSO: c.gso})
				b, dst = a, netip.IPv6Loopback()
			} else {
				a, b = listenPairOpts(t, &SocketOptions{GSO: c.gso}, &SocketOptions{})
			}
			r := rand.New(rand.NewPCG(41, 42))
			const rounds, per = 8, 48
			changed := map[uint32]bool{}
			seq := uint32(0)
			for range rounds {
				pkts := make([]Packet, per)
				for i := range pkts {
					n := 4096
					if r.IntN(4) == 0 {
						n = 1 + r.IntN(4096)
					}
					_, pkts[i] = zcPacket(seq, n, dst)
					seq++
				}
				testHookZeroCopySent = func(msg []Packet) {
					for i := range msg {
						p := &msg[i]
						if len(p.Payload) == 0 || r.IntN(3) != 0 {
							continue
						}
						burst := 1 + r.IntN(4)
						off := r.IntN(len(p.Payload))
						for k := 0; k < burst && off+k < len(p.Payload); k++ {
							x := byte(r.IntN(256))
							if k == 0 && x == 0 {
								x = 1 // the burst changes at least its first byte
							}
							p.Payload[off+k] ^= x
						}
						changed[seqOf(p.Buf)] = true
					}
				}
				err := a.Send(pkts)
				testHookZeroCopySent = nil
				if err != nil {
					t.Fatal(err)
				}
			}
			want := int(seq) - len(changed)
			got := recvN(t, b, want, 10*time.Second)
			for _, p := range got {
				if changed[seqOf(p.Buf)] {
					t.Fatalf("packet %d was changed after its ICRC was computed and still delivered", seqOf(p.Buf))
				}
			}
			// Nothing more arrives: the changed packets were dropped.
			time.Sleep(50 * time.Millisecond)
			if s := b.Stats(); s.DropBadICRC != uint64(len(changed)) || s.RcvdPkts != uint64(want) {
				t.Errorf("receiver stats %+v, want %d bad ICRC, %d received", s, len(changed), want)
			}
			if len(changed) == 0 {
				t.Fatal("no packet was changed: the test tested nothing")
			}
		})
	}
}

// TestDeferVerify: with SetDeferVerify(true) Recv hands out packets whose
// ICRC it has not checked — in place from GRO buffers, copied without
// GRO — and VerifyICRC accepts the intact ones, refuses the corrupted
// ones and counts them (DropBadICRC, out of RcvdPkts). Wrap never
// forwards the capability.
func TestDeferVerify(t *testing.T) { forGRO(t, "", testDeferVerify) }

func testDeferVerify(t *testing.T, ob *SocketOptions) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, ob)
	if CapabilitiesOf(b)&CapDeferVerify == 0 || CapabilitiesOf(Wrap{Link: b, PassPayload: true})&CapDeferVerify != 0 {
		t.Fatalf("capabilities: link %v, wrapped %v", CapabilitiesOf(b), CapabilitiesOf(Wrap{Link: b}))
	}
	b.SetDeferVerify(true)
	b.SetRecvInPlace(true)
	const total = 40
	pkts := make([]Packet, total)
	for i := range pkts {
		pkts[i] = Packet{Buf: testPayload(make([]byte, 1052), uint32(i), 1052), Addr: sockB}
	}
	if err := a.Send(pkts); err != nil {
		t.Fatal(err)
	}
	bad := 0
	r := recvBufs(64)
	for got := 0; got < total; {
		for i := range r {
			r[i].Buf = r[i].Buf[:cap(r[i].Buf)]
			if cap(r[i].Buf) < MaxPacketSize {
				r[i].Buf = make([]byte, MaxPacketSize)
			}
		}
		n, err := b.Recv(r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			p := &r[i]
			seq := seqOf(p.Buf)
			corrupt := seq%5 == 2
			if corrupt {
				p.Buf[len(p.Buf)/2] ^= 0x10 // after Recv, before the check: what a bad packet looks like
				bad++
			}
			if ok := b.VerifyICRC(p); ok == corrupt {
				t.Fatalf("packet %d (corrupted %v): VerifyICRC %v", seq, corrupt, ok)
			}
		}
		got += n
	}
	if s := b.Stats(); s.DropBadICRC != uint64(bad) || s.RcvdPkts != uint64(total-bad) {
		t.Errorf("stats %+v, want %d bad ICRC, %d received", s, bad, total-bad)
	}
}

// TestDeferVerifyGuessesGROSegment: VerifyICRC of packets handed out in
// place from GRO buffers guesses identification 0 for a packet at the
// start of a buffer (the first segment of a coalesced datagram) and the
// one after the last packet's for the others, so that no packet of
// datagrams sent with or without GSO costs a solve. With the second guess
// alone, each datagram after the first cost one: an 8-byte ping-pong paid
// one per message, a sender without GSO one per packet.
func TestDeferVerifyGuessesGROSegment(t *testing.T) {
	a, b := listenPairOpts(t, &SocketOptions{GSO: true}, &SocketOptions{})
	if b.gro == nil {
		t.Skip("no UDP_GRO on this socket")
	}
	b.SetDeferVerify(true)
	b.SetRecvInPlace(true)
	// GSO datagrams of 3 and 2 segments, and single datagrams (sent
	// without GSO: identification 0 each).
	groups := []int{3, 1, 1, 3, 2, 1, 3}
	total := 0
	r := recvBufs(64)
	seq := uint32(0)
	for _, per := range groups {
		total += per
		pkts := make([]Packet, per)
		for i := range pkts {
			pkts[i] = Packet{Buf: testPayload(make([]byte, 200), seq, 200), Addr: sockB}
			seq++
		}
		// One datagram of per segments (identifications 0..per-1).
		if err := a.Send(pkts); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < total; {
		for i := range r {
			if cap(r[i].Buf) < MaxPacketSize {
				r[i].Buf = make([]byte, MaxPacketSize)
			}
			r[i].Buf = r[i].Buf[:cap(r[i].Buf)]
		}
		n, err := b.Recv(r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if !b.VerifyICRC(&r[i]) {
				t.Fatalf("packet %d: VerifyICRC refused an intact packet", seqOf(r[i].Buf))
			}
		}
		got += n
	}
	if c := b.groCoalesced.Load(); c == 0 {
		t.Skip("the datagrams were not coalesced (no GSO/GRO on this path): nothing to guess")
	}
	if m := b.dvMiss.Load(); m != 0 {
		t.Errorf("%d of %d packets' identifications were not guessed (each cost a solve), want 0", m, total)
	}
}
