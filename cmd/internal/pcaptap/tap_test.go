package pcaptap

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/udp"
)

// build returns a RoCEv2 SEND_ONLY payload with n payload bytes.
func build(t testing.TB, n int, psn uint32) []byte {
	t.Helper()
	buf := make([]byte, udp.MaxPacketSize)
	f := packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, PKey: bth.DefaultPKey, DestQP: 0x11, PSN: bth.PSN(psn), AckReq: true},
		Payload: bytes.Repeat([]byte{byte(n)}, n)}
	l, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:l]
}

// TestTapMemNetwork sends packets both ways between two MemLinks, each
// wrapped in a Tap recording both directions, and checks that every frame
// in the capture decodes as Ethernet/IP/UDP/BTH with a valid ICRC.
func TestTapMemNetwork(t *testing.T) {
	for _, addrs := range [][2]string{{"192.0.2.1", "192.0.2.2"}, {"2001:db8::1", "2001:db8::2"}} {
		var out bytes.Buffer
		w, err := NewWriter(&out)
		if err != nil {
			t.Fatal(err)
		}
		n := udp.NewMemNetwork(udp.Faults{})
		a, b := netip.MustParseAddr(addrs[0]), netip.MustParseAddr(addrs[1])
		la, _ := n.Link(a)
		lb, _ := n.Link(b)
		ta, tb := New(la, w, Both), New(lb, w, Both)
		const count = 6
		for i := 0; i < count; i++ {
			p := []udp.Packet{{Buf: build(t, 100*i+1, uint32(i)), Addr: b, SrcPort: 0xc123, TOS: 2}}
			if err := ta.Send(p); err != nil {
				t.Fatal(err)
			}
			rp := []udp.Packet{{Buf: make([]byte, udp.MaxPacketSize)}}
			if k, err := tb.Recv(rp); err != nil || k != 1 {
				t.Fatal(k, err)
			}
		}
		if w.Packets() != 2*count || w.Unverified() != 0 {
			t.Fatalf("%v: %d packets, %d unverified", addrs, w.Packets(), w.Unverified())
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		r, err := pcapgo.NewReader(&out)
		if err != nil {
			t.Fatal(err)
		}
		frames := 0
		for {
			data, _, err := r.ReadPacketData()
			if err != nil {
				break
			}
			frames++
			p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
			if p.Layer(rocelayer.LayerTypeBTH) == nil {
				t.Fatalf("frame %d: no BTH: %v", frames, p)
			}
			if err := rocelayer.VerifyICRC(p); err != nil {
				t.Fatalf("frame %d: %v", frames, err)
			}
		}
		if frames != 2*count {
			t.Fatalf("%d frames", frames)
		}
	}
}

// TestWriterUnverified: a payload whose ICRC no header explains is written
// and counted.
func TestWriterUnverified(t *testing.T) {
	var out bytes.Buffer
	w, _ := NewWriter(&out)
	p := build(t, 10, 1) // ICRC still zero
	if err := w.WritePacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0xc000, 0, p); err != nil {
		t.Fatal(err)
	}
	if w.Unverified() != 1 || w.Packets() != 1 {
		t.Fatalf("unverified %d packets %d", w.Unverified(), w.Packets())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.WritePacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), 0xc000, 0, p); err != ErrClosed {
		t.Fatalf("after close: %v", err)
	}
}
