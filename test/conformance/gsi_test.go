package conformance

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
)

// TestGSIMatchesRxe replays the CM MADs of rdmacm_rping (REQ, REP, RTU,
// DREQ, DREP between two rxe hosts): each host's QP1 receives the other
// side's MADs unchanged (source address and QP), and sends its own again;
// what it sends equals rxe's packets byte for byte (BTH, DETH, MAD) and
// leaves from rxe's UDP source port for QP1.
func TestGSIMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	frames := load(t, filepath.Join(dir, "rdmacm_rping.pcap"))
	var mads []*frame
	for _, f := range frames {
		if f.pk.BTH.DestQP() == 1 {
			mads = append(mads, f)
		}
	}
	if len(mads) < 5 {
		t.Fatalf("%d MADs in the capture, want the 5 of REQ..DREP", len(mads))
	}
	for _, h := range []netip.Addr{mads[0].src, mads[0].dst} {
		t.Run("host="+h.String(), func(t *testing.T) {
			link := newRecLink(h)
			dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			gsi, err := dev.GSI()
			if err != nil {
				t.Fatal(err)
			}
			agent, err := gsi.Register(0x07, 16)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, f := range mads {
				if f.dst == h {
					if err := dev.HandlePacket(f.payload, f.src); err != nil {
						t.Fatalf("frame %d: %v", f.num, err)
					}
					m, err := agent.Recv(ctx)
					if err != nil {
						t.Fatalf("frame %d: %v", f.num, err)
					}
					if m.Src != f.src || m.SrcQP != 1 || !bytes.Equal(m.Data[:], f.pk.Payload) {
						t.Fatalf("frame %d: MAD from %v qp %d differs", f.num, m.Src, m.SrcQP)
					}
					continue
				}
				if err := agent.Send(f.dst, f.pk.BTH.DestQP(), 0, f.pk.Payload); err != nil {
					t.Fatal(err)
				}
				sent := link.take()
				if len(sent) != 1 {
					t.Fatalf("frame %d: sent %d packets", f.num, len(sent))
				}
				got, want := sent[0].Buf, f.payload
				if !bytes.Equal(got[:len(got)-4], want[:len(want)-4]) {
					t.Fatalf("frame %d: sent\n%x\nrxe sent\n%x", f.num, got[:len(got)-4], want[:len(want)-4])
				}
				if sent[0].SrcPort != f.sport {
					t.Fatalf("frame %d: source port %d, rxe %d", f.num, sent[0].SrcPort, f.sport)
				}
			}
			if c := dev.Counters(); c.MADSent == 0 || c.MADRcvd == 0 {
				t.Fatalf("mad_sent %d mad_rcvd %d", c.MADSent, c.MADRcvd)
			}
		})
	}
}
