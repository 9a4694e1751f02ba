package transport

import (
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
	"github.com/gorocev2/rocev2/udp"
)

// sinkLink discards what is sent and never receives.
type sinkLink struct {
	addr netip.Addr
	done chan struct{}
	once sync.Once
}

func (l *sinkLink) Send([]udp.Packet) error { return nil }
func (l *sinkLink) Recv([]udp.Packet) (int, error) {
	<-l.done
	return 0, net.ErrClosed
}
func (l *sinkLink) LocalAddr() netip.Addr { return l.addr }
func (l *sinkLink) BatchSize() int        { return 1 }
func (l *sinkLink) Stats() udp.Stats      { return udp.Stats{} }
func (l *sinkLink) Close() error          { l.once.Do(func() { close(l.done) }); return nil }

// FuzzQPInput feeds arbitrary packets (DestQP forced to the QP, PSN near
// the expected one) to an RTS QP with outstanding work requests and posted
// receives. Nothing may panic, and the QP must stay usable or reach ERR.
func FuzzQPInput(f *testing.F) {
	mk := func(fl packet.Fields) []byte {
		buf := make([]byte, udp.MaxPacketSize)
		n, err := packet.Build(buf, &fl)
		if err != nil {
			panic(err)
		}
		return buf[:n]
	}
	pay := make([]byte, 300)
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly, PKey: 0xffff}, RETH: packetRETH(0x1000, 0, 300), Payload: pay}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteFirst, PKey: 0xffff}, RETH: packetRETH(0x1000, 0, 600), Payload: pay[:256]}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, PKey: 0xffff, AckReq: true}, Payload: pay}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendFirst, PKey: 0xffff}, Payload: pay[:256]}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PKey: 0xffff}, RETH: packetRETH(0x1000, 0, 5000)}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCFetchAdd, PKey: 0xffff}}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff}}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadResponseFirst, PKey: 0xffff}, Payload: pay[:256]}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCAtomicAck, PKey: 0xffff}}))
	f.Add([]byte{})
	// A selective NAK (SACK block after the AETH) and a plain sequence NAK.
	var sk [aeth.SACKMaxSize]byte
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, PSN: 101}, AETH: aeth.Fields{Syndrome: aeth.NAK(aeth.NAKPSNSeqError)},
		Payload: sk[:aeth.EncodeSACK(sk[:], []uint32{0xa0000000, 0, 0, 1})]}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, PSN: 100}, AETH: aeth.Fields{Syndrome: aeth.NAK(aeth.NAKPSNSeqError)}}))
	f.Add(mk(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteMiddle, PKey: 0xffff, PSN: 203}, Payload: pay[:256]}))

	sl := &sinkLink{addr: addrA, done: make(chan struct{})}
	dev, err := NewDevice(sl, DeviceConfig{Clock: manual()})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	o := pairOpts{mtu: MTU256}
	o.defaults()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(1 << 16)
	qp, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 64})
	mem := make([]byte, 8192)
	mr, _ := pd.RegisterMRIOVA(mem, 0x1000, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
	peer := &side{qp: &QP{qpn: 0x99}}
	// The same input goes to a QP with selective repeat (qpSR): its
	// responder holds out-of-order requests, its requester takes SACKs.
	qpSR, _ := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 64})
	oSR := o
	oSR.sr = true
	setupQP := func(tb testing.TB, qp *QP, o *pairOpts) {
		_ = qp.Modify(&QPAttr{State: QPSReset}, AttrState)
		s := &side{qp: qp}
		connect(tb, s, peer, addrB, 100, 200, o)
		qp.PostRecv(RecvWR{SGEs: sge(mr, 0, 4096)}, RecvWR{SGEs: sge(mr, 4096, 100)})
		qp.PostSend(
			SendWR{Opcode: WRWrite, SGEs: sge(mr, 0, 600), RemoteAddr: 5, RKey: 6},
			SendWR{Opcode: WRRead, SGEs: sge(mr, 0, 600), RemoteAddr: 5, RKey: 6},
			SendWR{Opcode: WRFetchAdd, SGEs: sge(mr, 0, 8), RemoteAddr: 8, RKey: 6},
		)
	}
	setup := func(tb testing.TB) { setupQP(tb, qp, &o) }
	setup(f)
	setupQP(f, qpSR, &oSR)
	if !qpSR.SelectiveRepeat() || qp.SelectiveRepeat() {
		f.Fatal("selective repeat not as set up")
	}
	var wc [64]WC
	f.Fuzz(func(t *testing.T, b []byte) {
		b = append([]byte(nil), b...)
		if len(b) >= bth.Size {
			h := bth.BTH(b)
			h.SetDestQP(qp.QPN())
			// Keep PSNs near both windows most of the time.
			switch b[len(b)-1] % 3 {
			case 0:
				h.SetPSN(bth.PSN(200).Add(int(int8(b[9]))))
			case 1:
				h.SetPSN(bth.PSN(100).Add(int(int8(b[9]))))
			}
			if len(b) >= bth.Size+16 && h.Opcode().Info().Headers&bth.HdrRETH != 0 {
				b[bth.Size+8], b[bth.Size+9], b[bth.Size+10], b[bth.Size+11] = byte(mr.RKey()>>24), byte(mr.RKey()>>16), byte(mr.RKey()>>8), byte(mr.RKey())
			}
		}
		_ = dev.HandlePacket(b, addrB)
		if len(b) >= bth.Size {
			bth.BTH(b).SetDestQP(qpSR.QPN())
			_ = dev.HandlePacket(b, addrB)
		}
		for cq.Poll(wc[:]) > 0 {
		}
		if qp.State() == QPSErr {
			setup(t)
		}
		if qpSR.State() == QPSErr {
			setupQP(t, qpSR, &oSR)
		}
	})
}

func packetRETH(va uint64, rkey, n uint32) (r rethFields) {
	r.VA, r.RKey, r.DMALength = va, rkey, n
	return r
}

type rethFields = reth.Fields
