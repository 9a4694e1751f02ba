package transport

import (
	"net/netip"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
)

// TestWrongPeerDropped: a request for a connected QP from an address
// other than its peer is dropped and counted (wrong_peer), while one from
// the peer — in its own form or as an IPv4-mapped IPv6 address — is
// taken (rcvd_pkts). inputLocked compares the source with the peer
// before it unmaps it.
func TestWrongPeerDropped(t *testing.T) {
	_, b, _ := newPair(t, pairOpts{})
	buf := make([]byte, 64)
	f := packet.Fields{}
	f.BTH.Opcode, f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN = bth.RCSendOnly, bth.DefaultPKey, b.qp.QPN(), 0x123456
	f.Payload = []byte{1, 2, 3, 4}
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		src   netip.Addr
		taken bool
	}{
		{netip.MustParseAddr("192.0.2.9"), false},
		{netip.MustParseAddr("::ffff:192.0.2.9"), false},
		{netip.MustParseAddr("2001:db8::1"), false},
		{addrA, true},
		{netip.AddrFrom16(addrA.As16()), true}, // ::ffff:192.0.2.1
	} {
		before := b.dev.Counters()
		if err := b.dev.HandlePacket(buf[:n], tc.src); err != nil {
			t.Fatalf("%v: %v", tc.src, err)
		}
		after := b.dev.Counters()
		wrong, rcvd := after.WrongPeer-before.WrongPeer, after.RcvdPkts-before.RcvdPkts
		if tc.taken && (wrong != 0 || rcvd != 1) || !tc.taken && (wrong != 1 || rcvd != 0) {
			t.Fatalf("from %v: wrong_peer +%d, rcvd_pkts +%d; taken %v", tc.src, wrong, rcvd, tc.taken)
		}
	}
}

// TestForeignPKeyDropped: a request from the QP's peer whose partition
// key is not the default one (low 15 bits; the top bit, full or limited
// membership, is not compared) is dropped and counted (wrong_peer), one
// with the default key in either membership is taken (rcvd_pkts).
// inputLocked reads the key after one bounds check of the whole BTH.
func TestForeignPKeyDropped(t *testing.T) {
	_, b, _ := newPair(t, pairOpts{})
	for _, tc := range []struct {
		pkey  uint16
		taken bool
	}{
		{0x1234, false},
		{0x8001, false},
		{0xfffe, false},
		{bth.DefaultPKey, true},
		{bth.DefaultPKey & 0x7fff, true},
	} {
		buf := make([]byte, 64)
		f := packet.Fields{}
		f.BTH.Opcode, f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN = bth.RCSendOnly, tc.pkey, b.qp.QPN(), 0x123456
		f.Payload = []byte{1, 2, 3, 4}
		n, err := packet.Build(buf, &f)
		if err != nil {
			t.Fatal(err)
		}
		before := b.dev.Counters()
		if err := b.dev.HandlePacket(buf[:n], addrA); err != nil {
			t.Fatalf("pkey %#x: %v", tc.pkey, err)
		}
		after := b.dev.Counters()
		wrong, rcvd := after.WrongPeer-before.WrongPeer, after.RcvdPkts-before.RcvdPkts
		if tc.taken && (wrong != 0 || rcvd != 1) || !tc.taken && (wrong != 1 || rcvd != 0) {
			t.Fatalf("pkey %#x: wrong_peer +%d, rcvd_pkts +%d; taken %v", tc.pkey, wrong, rcvd, tc.taken)
		}
	}
}
