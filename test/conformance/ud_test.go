package conformance

import (
	"bytes"
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
)

// TestUDMatchesRxe replays the UD captures (ibv_ud_pingpong between two
// rxe hosts, and between rxe and a host peer): for each host whose QPN
// this device can reach, a UD QP with that QPN and the capture's Q_Key
// receives the other side's datagrams (payload, source QP, GRH) and sends
// that host's datagrams again from the same payloads; what it sends must
// equal rxe's packets byte for byte (BTH .. payload) and leave from the
// same UDP source port.
func TestUDMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	for _, name := range []string{"ud_send_512", "host_ud_interop"} {
		t.Run(name, func(t *testing.T) {
			frames := load(t, filepath.Join(dir, name+".pcap"))
			var ud []*frame
			for _, f := range frames {
				if f.pk.Info.Transport == bth.TransportUD && f.pk.BTH.DestQP() != 1 {
					ud = append(ud, f)
				}
			}
			if len(ud) < 2 {
				t.Fatalf("%d UD datagrams in the capture", len(ud))
			}
			checked := 0
			for _, h := range []netip.Addr{ud[0].src, ud[0].dst} {
				var mine []*frame
				for _, f := range ud {
					if f.src == h {
						mine = append(mine, f)
					}
				}
				qpn := mine[0].pk.DETH.SrcQP()
				if qpn > 0x40 {
					t.Logf("host %v: QPN %#x is beyond what a fresh device hands out here; checked from the other side only", h, qpn)
					continue
				}
				t.Run("host="+h.String(), func(t *testing.T) { checkUD(t, ud, h, qpn) })
				checked++
			}
			if checked == 0 {
				t.Fatal("no host checked")
			}
		})
	}
}

func checkUD(t *testing.T, ud []*frame, h netip.Addr, qpn uint32) {
	link := newRecLink(h)
	dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	var qp *transport.QP
	for {
		q, err := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		if q.QPN() == qpn {
			qp = q
			break
		}
		if q.QPN() > qpn {
			t.Fatalf("QPN %#x skipped", qpn)
		}
	}
	var first *frame
	for _, f := range ud {
		if f.src == h {
			first = f
			break
		}
	}
	qkey := first.pk.DETH.QKey()
	if err := qp.ReadyUD(qkey, uint32(first.pk.BTH.PSN())); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	mr, err := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ahs := map[netip.Addr]*transport.AH{}
	for i, f := range ud {
		switch {
		case f.dst == h:
			// Receive: post a buffer, feed the datagram, check the WC and the GRH.
			if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{mr.SGE(0, 4096)}}); err != nil {
				t.Fatal(err)
			}
			if err := dev.HandlePacket(f.payload, f.src); err != nil {
				t.Fatalf("frame %d: %v", f.num, err)
			}
			var wc [1]transport.WC
			if _, err := cq.Wait(ctx, wc[:]); err != nil {
				t.Fatalf("frame %d: %v", f.num, err)
			}
			w := wc[0]
			n := len(f.pk.Payload)
			if w.Status != transport.WCSuccess || w.WRID != uint64(i) || w.SrcQP != f.pk.DETH.SrcQP() ||
				w.ByteLen != uint32(transport.GRHSize+n) || w.Flags&transport.WCGRH == 0 || w.NetworkHdrType != transport.NetworkIPv4 {
				t.Fatalf("frame %d: WC %+v", f.num, w)
			}
			if !bytes.Equal(buf[transport.GRHSize:transport.GRHSize+n], f.pk.Payload) {
				t.Fatalf("frame %d: payload differs", f.num)
			}
			ah, err := transport.AHFromGRH(buf[:transport.GRHSize])
			if err != nil || ah.Addr != f.src {
				t.Fatalf("frame %d: GRH source %v (%v), want %v", f.num, ah.Addr, err, f.src)
			}
		case f.src == h:
			// Send the same datagram and compare with rxe's.
			ah := ahs[f.dst]
			if ah == nil {
				if ah, err = dev.CreateAH(transport.AHAttr{Addr: f.dst}); err != nil {
					t.Fatal(err)
				}
				ahs[f.dst] = ah
			}
			n := len(f.pk.Payload)
			copy(buf[8192:], f.pk.Payload)
			wr := transport.SendWR{WRID: uint64(i), Opcode: transport.WRSend, Flags: transport.SendSignaled,
				SGEs: []memreg.SGE{mr.SGE(8192, uint32(n))}, AH: ah, RemoteQPN: f.pk.BTH.DestQP(), RemoteQKey: f.pk.DETH.QKey()}
			if f.pk.Info.Imm {
				wr.Opcode, wr.Imm = transport.WRSendImm, f.pk.ImmDt.Imm()
			}
			if err := qp.PostSend(wr); err != nil {
				t.Fatal(err)
			}
			var wc [1]transport.WC
			if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Status != transport.WCSuccess {
				t.Fatalf("frame %d: send completion %+v %v", f.num, wc[0], err)
			}
			sent := link.take()
			if len(sent) != 1 {
				t.Fatalf("frame %d: sent %d packets", f.num, len(sent))
			}
			got, want := sent[0].Buf, f.payload
			if !bytes.Equal(got[:len(got)-4], want[:len(want)-4]) {
				t.Fatalf("frame %d: sent\n%x\nrxe sent\n%x", f.num, got[:len(got)-4], want[:len(want)-4])
			}
			if sent[0].SrcPort != f.sport || sent[0].Addr != f.dst {
				t.Fatalf("frame %d: sent to %v from port %d, rxe from %d", f.num, sent[0].Addr, sent[0].SrcPort, f.sport)
			}
		}
	}
}
