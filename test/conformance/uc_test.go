package conformance

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
)

// TestUCMatchesRxe replays uc_send_4096 (ibv_uc_pingpong, 4 KiB SENDs at
// MTU 1024): each host's UC QP (same QPN, PSNs from the capture) receives
// the other's messages whole, and sends its own again; its packets equal
// rxe's byte for byte (BTH .. payload) and leave from the same UDP port.
func TestUCMatchesRxe(t *testing.T) {
	frames := load(t, filepath.Join(golden.Dir(t), "uc_send_4096.pcap"))
	var uc []*frame
	for _, f := range frames {
		if f.pk.Info.Transport == bth.TransportUC {
			uc = append(uc, f)
		}
	}
	if len(uc) < 8 {
		t.Fatalf("%d UC packets", len(uc))
	}
	hosts := [2]*frame{}
	for _, f := range uc {
		if hosts[0] == nil {
			hosts[0] = f
		} else if hosts[1] == nil && f.src != hosts[0].src {
			hosts[1] = f
		}
	}
	for i, first := range hosts {
		other := hosts[1-i]
		t.Run("host="+first.src.String(), func(t *testing.T) {
			link := newRecLink(first.src)
			dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			pd, _ := dev.AllocPD()
			cq, _ := dev.CreateCQ(64)
			myQPN := other.pk.BTH.DestQP()
			var qp *transport.QP
			for qp == nil || qp.QPN() < myQPN {
				if qp, err = dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8}); err != nil {
					t.Fatal(err)
				}
			}
			if qp.QPN() != myQPN {
				t.Fatalf("QPN %#x skipped", myQPN)
			}
			err = qp.Connect(transport.ConnParams{Peer: other.src, DestQPN: first.pk.BTH.DestQP(), SQPSN: uint32(first.pk.BTH.PSN()),
				RQPSN: uint32(other.pk.BTH.PSN()), PathMTU: transport.MTU1024})
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 16384)
			mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var msg []byte // the message being replayed from this host
			for _, f := range uc {
				if f.dst == first.src {
					if f.pk.Info.Pos == bth.PosFirst || f.pk.Info.Pos == bth.PosOnly {
						if err := qp.PostRecv(transport.RecvWR{SGEs: []memreg.SGE{mr.SGE(0, 8192)}}); err != nil {
							t.Fatal(err)
						}
						msg = msg[:0]
					}
					msg = append(msg, f.pk.Payload...)
					if err := dev.HandlePacket(f.payload, f.src); err != nil {
						t.Fatal(err)
					}
					if f.pk.Info.Pos == bth.PosLast || f.pk.Info.Pos == bth.PosOnly {
						var wc [1]transport.WC
						if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil || int(wc[0].ByteLen) != len(msg) {
							t.Fatalf("frame %d: recv %+v %v", f.num, wc[0], err)
						}
						if !bytes.Equal(buf[:len(msg)], msg) {
							t.Fatalf("frame %d: message differs", f.num)
						}
					}
					continue
				}
				if f.pk.Info.Pos == bth.PosFirst || f.pk.Info.Pos == bth.PosOnly {
					// Gather this message's packets and send it in one WR.
					var whole []byte
					for _, g := range uc[indexOf(uc, f):] {
						if g.src != f.src {
							continue
						}
						whole = append(whole, g.pk.Payload...)
						if g.pk.Info.Pos == bth.PosLast || g.pk.Info.Pos == bth.PosOnly {
							break
						}
					}
					copy(buf[8192:], whole)
					if err := qp.PostSend(transport.SendWR{Opcode: transport.WRSend, Flags: transport.SendSignaled,
						SGEs: []memreg.SGE{mr.SGE(8192, uint32(len(whole)))}}); err != nil {
						t.Fatal(err)
					}
					var wc [1]transport.WC
					if _, err := cq.Wait(ctx, wc[:]); err != nil || wc[0].Err() != nil {
						t.Fatalf("send: %v %v", err, wc[0].Err())
					}
				}
				sent := link.take()
				if len(sent) == 0 {
					t.Fatalf("frame %d: nothing sent", f.num)
				}
				link.mu.Lock()
				link.sent = append(sent[1:], link.sent...)
				link.mu.Unlock()
				got, want := sent[0].Buf, f.payload
				if !bytes.Equal(got[:len(got)-4], want[:len(want)-4]) || sent[0].SrcPort != f.sport {
					t.Fatalf("frame %d: sent port %d\n%x\nrxe port %d\n%x", f.num, sent[0].SrcPort, got[:min(len(got), 40)], f.sport, want[:min(len(want), 40)])
				}
			}
		})
	}
}

func indexOf(fs []*frame, f *frame) int {
	for i, g := range fs {
		if g == f {
			return i
		}
	}
	return -1
}
