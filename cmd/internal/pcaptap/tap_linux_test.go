//go:build linux

package pcaptap

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/udp"
)

// TestTapSocketLink taps a SocketLink, which sends from its own ephemeral
// port (SendPort) whatever Packet.SrcPort asks for, with and without GSO
// (segment IDs 0, 1, ...): every recorded frame carries SendPort as its UDP
// source port and an ICRC valid for the reconstructed header.
func TestTapSocketLink(t *testing.T) {
	id := os.Getpid()
	a := netip.AddrFrom4([4]byte{127, 93, byte(id >> 8), byte(id)})
	b := netip.AddrFrom4([4]byte{127, 94, byte(id >> 8), byte(id)})
	for _, gso := range []bool{false, true} {
		t.Run(fmt.Sprint("gso=", gso), func(t *testing.T) {
			la, err := udp.ListenSocket(a, &udp.SocketOptions{GSO: gso, NoGRO: true, Share: udp.ShareOff})
			if errors.Is(err, syscall.EADDRINUSE) {
				t.Skipf("%v:4791 taken: %v", a, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer la.Close()
			lb, err := udp.ListenSocket(b, &udp.SocketOptions{NoGRO: true, Share: udp.ShareOff})
			if errors.Is(err, syscall.EADDRINUSE) {
				t.Skipf("%v:4791 taken: %v", b, err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Close()
			var out bytes.Buffer
			w, err := NewWriter(&out)
			if err != nil {
				t.Fatal(err)
			}
			const count = 8
			pkts := make([]udp.Packet, count)
			for i := range pkts {
				pkts[i] = udp.Packet{Buf: build(t, 1024, uint32(i)), Addr: b, SrcPort: 0xc123}
			}
			if err := New(la, w, Sent).Send(pkts); err != nil {
				t.Fatal(err)
			}
			rp := make([]udp.Packet, count)
			for i := range rp {
				rp[i].Buf = make([]byte, udp.MaxPacketSize)
			}
			for got, deadline := 0, time.Now().Add(5*time.Second); got < count; {
				if time.Now().After(deadline) {
					t.Fatalf("received %d of %d", got, count)
				}
				n, err := lb.Recv(rp[got:])
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range rp[got : got+n] {
					if p.SrcPort != la.SendPort() {
						t.Errorf("received from port %d, SendPort %d", p.SrcPort, la.SendPort())
					}
				}
				got += n
			}
			if w.Packets() != count || w.Unverified() != 0 {
				t.Fatalf("%d packets, %d unverified", w.Packets(), w.Unverified())
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			r, err := pcapgo.NewReader(&out)
			if err != nil {
				t.Fatal(err)
			}
			for frames := 0; frames < count; frames++ {
				data, _, err := r.ReadPacketData()
				if err != nil {
					t.Fatalf("frame %d: %v", frames, err)
				}
				p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
				u, _ := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
				if u == nil || uint16(u.SrcPort) != la.SendPort() {
					t.Fatalf("frame %d: UDP %v, want source port %d", frames, u, la.SendPort())
				}
				if err := rocelayer.VerifyICRC(p); err != nil {
					t.Fatalf("frame %d: %v", frames, err)
				}
			}
		})
	}
}
