package transport

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// udSide is a device with one UD QP in RTS.
type udSide struct {
	*side
	buf []byte
	mr  *memreg.MR
}

func newUDSide(t *testing.T, n *memnet.MemNetwork, addr [4]byte, qkey uint32, cfg DeviceConfig) *udSide {
	t.Helper()
	l, err := n.Link(netipFrom4(addr))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := NewDevice(l, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ReadyUD(qkey, 0x100); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16<<10)
	mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
	return &udSide{side: &side{dev: dev, pd: pd, scq: cq, rcq: cq, qp: qp}, buf: buf, mr: mr}
}

func (s *udSide) send(t *testing.T, to *udSide, off, n int, qkey uint32, op WROpcode) error {
	t.Helper()
	ah, err := s.dev.CreateAH(AHAttr{Addr: to.dev.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	return s.qp.PostSend(SendWR{WRID: 99, Opcode: op, Imm: 0xabcd, Flags: SendSignaled, SGEs: []memreg.SGE{s.mr.SGE(uint64(off), uint32(n))},
		AH: ah, RemoteQPN: to.qp.QPN(), RemoteQKey: qkey})
}

// TestUDSendRecv: a UD SEND and SEND with immediate arrive with the GRH in
// the first 40 bytes (IPv4 header in the last 20), the source QP, the GRH
// and network-type flags; the sender can answer through AHFromGRH.
func TestUDSendRecv(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newUDSide(t, n, [4]byte{192, 0, 2, 1}, 0x11111111, DeviceConfig{})
	b := newUDSide(t, n, [4]byte{192, 0, 2, 2}, 0x11111111, DeviceConfig{})
	fill(a.buf[:1024], 3)
	for _, op := range []WROpcode{WRSend, WRSendImm} {
		if err := b.qp.PostRecv(RecvWR{WRID: 5, SGEs: []memreg.SGE{b.mr.SGE(0, 2048)}}); err != nil {
			t.Fatal(err)
		}
		if err := a.send(t, b, 0, 1024, 0x11111111, op); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.Opcode != WCSend {
			t.Fatalf("send WC %+v", wc)
		}
		if c := a.dev.Counters().RDMASends; c == 0 {
			t.Fatal("rdma_sends not counted for a UD send (rxe counts it)")
		}
		wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]
		if wc.Status != WCSuccess || wc.WRID != 5 || wc.ByteLen != GRHSize+1024 || wc.SrcQP != a.qp.QPN() ||
			wc.Flags&WCGRH == 0 || wc.Flags&WCWithNetworkHdrType == 0 || wc.NetworkHdrType != NetworkIPv4 {
			t.Fatalf("recv WC %+v", wc)
		}
		if (op == WRSendImm) != (wc.Flags&WCWithImm != 0) || (op == WRSendImm && wc.Imm != 0xabcd) {
			t.Fatalf("%v: imm flags %v imm %#x", op, wc.Flags, wc.Imm)
		}
		if !bytes.Equal(b.buf[GRHSize:GRHSize+1024], a.buf[:1024]) {
			t.Fatal("payload differs")
		}
		g := b.buf[:GRHSize]
		if !bytes.Equal(g[:20], make([]byte, 20)) || g[20] != 0x45 || g[29] != 17 {
			t.Fatalf("GRH % x: want 20 zero bytes and an IPv4/UDP header", g)
		}
		ah, err := AHFromGRH(g)
		if err != nil || ah.Addr != a.dev.Addr() {
			t.Fatalf("AHFromGRH = %v, %v", ah, err)
		}
	}
}

// TestUDQKeys: a datagram with another Q_Key is dropped and counted; a
// RemoteQKey with the high bit set sends the QP's own Q_Key; a user QP may
// not take a controlled Q_Key.
func TestUDQKeys(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newUDSide(t, n, [4]byte{192, 0, 2, 1}, 0x22222222, DeviceConfig{})
	b := newUDSide(t, n, [4]byte{192, 0, 2, 2}, 0x22222222, DeviceConfig{})
	if err := b.qp.PostRecv(RecvWR{WRID: 1, SGEs: []memreg.SGE{b.mr.SGE(0, 2048)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.send(t, b, 0, 16, 0x33333333, WRSend); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for b.dev.Counters().QKeyViolation == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if c := b.dev.Counters().QKeyViolation; c != 1 {
		t.Fatalf("qkey_violation = %d", c)
	}
	noWC(t, b.rcq)
	// High bit: the sender's own Q_Key (0x22222222) goes out.
	if err := a.send(t, b, 0, 16, ControlledQKey, WRSend); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
		t.Fatalf("recv WC %+v", wc)
	}
	err := b.qp.Modify(&QPAttr{State: QPSRTS, QKey: 0x80000001}, AttrState|AttrQKey)
	if !errors.Is(err, ErrInvalidAttr) {
		t.Fatalf("controlled Q_Key on a user QP: %v", err)
	}
}

// TestUDLimits: a message above the port MTU is refused at PostSend; a
// datagram larger than the receive buffer (with the GRH) is dropped and
// counted (ud_msgs_dropped); with no receive posted it is dropped and
// counted (ud_no_recv_wqe).
func TestUDLimits(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	a := newUDSide(t, n, [4]byte{192, 0, 2, 1}, 7, DeviceConfig{PortMTU: MTU2048})
	b := newUDSide(t, n, [4]byte{192, 0, 2, 2}, 7, DeviceConfig{})
	var we *WRError
	if err := a.send(t, b, 0, 2049, 7, WRSend); !errors.As(err, &we) || we.Field != "sg_list" {
		t.Fatalf("2049 bytes at MTU 2048: %v", err)
	}
	if err := a.send(t, b, 0, 100, 7, WRSend); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for b.dev.Counters().UDNoRecvWQE == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if c := b.dev.Counters().UDNoRecvWQE; c != 1 {
		t.Fatalf("ud_no_recv_wqe = %d", c)
	}
	if err := b.qp.PostRecv(RecvWR{WRID: 2, SGEs: []memreg.SGE{b.mr.SGE(0, GRHSize+50)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.send(t, b, 0, 100, 7, WRSend); err != nil {
		t.Fatal(err)
	}
	// Too long for the WQE: dropped and counted, the WQE stays posted
	// (TestUDOversizedDropped has the details).
	for b.dev.Counters().UDMsgsDropped == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if c := b.dev.Counters().UDMsgsDropped; c != 1 {
		t.Fatalf("ud_msgs_dropped = %d", c)
	}
	noWC(t, b.rcq)
	// RC verbs on a UD QP are refused.
	if err := a.qp.PostSend(SendWR{Opcode: WRWrite, SGEs: []memreg.SGE{a.mr.SGE(0, 8)}}); !errors.As(err, &we) || we.Field != "opcode" {
		t.Fatalf("WRITE on UD: %v", err)
	}
	if err := a.qp.Connect(ConnParams{}); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("Connect on UD: %v", err)
	}
}

// TestUDOversizedDropped: a datagram longer than the receive WQE (with
// its GRH) is not delivered, counted in ud_msgs_dropped, and the QP stays
// in RTS with its other receives posted, as rxe's RESPST_ERR_LENGTH does
// for UD: on the QP's own receive queue it is dropped with no completion
// and the WQE takes the next datagram that fits (class D); a WQE taken
// from an SRQ completes with a remote invalid request error (class E),
// so that the SRQ's other WQEs take the next datagrams. Before, one such
// datagram from any sender moved the QP to ERR and flushed every receive.
func TestUDOversizedDropped(t *testing.T) {
	for _, useSRQ := range []bool{false, true} {
		n := memnet.NewMemNetwork(memnet.Faults{})
		a := newUDSide(t, n, [4]byte{192, 0, 2, 1}, 7, DeviceConfig{})
		l, err := n.Link(netipFrom4([4]byte{192, 0, 2, 2}))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := NewDevice(l, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(64)
		ia := QPInitAttr{Type: QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8}
		var srq *SRQ
		if useSRQ {
			if srq, err = dev.CreateSRQ(pd, SRQAttr{MaxWR: 8}); err != nil {
				t.Fatal(err)
			}
			ia.SRQ = srq
		}
		qp, err := dev.CreateQP(pd, ia)
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.ReadyUD(7, 0); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
		for i := range 3 {
			wr := RecvWR{WRID: uint64(10 + i), SGEs: []memreg.SGE{mr.SGE(uint64(i*200), GRHSize+60)}}
			if useSRQ {
				err = srq.PostRecv(wr)
			} else {
				err = qp.PostRecv(wr)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		b := &udSide{side: &side{dev: dev, pd: pd, scq: cq, rcq: cq, qp: qp}, buf: buf, mr: mr}
		if err := a.send(t, b, 0, 61, 7, WRSend); err != nil {
			t.Fatal(err)
		}
		waitWC(t, a.scq, 1, 5*time.Second)
		deadline := time.Now().Add(5 * time.Second)
		for dev.Counters().UDMsgsDropped == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if c := dev.Counters().UDMsgsDropped; c != 1 {
			t.Fatalf("srq=%v: ud_msgs_dropped = %d after one datagram 1 byte too long", useSRQ, c)
		}
		if st := qp.State(); st != QPSRTS {
			t.Fatalf("srq=%v: one oversized datagram moved the UD QP to %v (%v)", useSRQ, st, qp.Err())
		}
		next := uint64(10) // the WQE the next datagram takes
		if useSRQ {
			// rxe's class E: the WQE taken from the SRQ completes with
			// a remote invalid request error (kept, it would turn away
			// every later datagram longer than it).
			if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.Status != WCRemInvReqErr || wc.WRID != 10 {
				t.Fatalf("srq: the oversized datagram's WQE: %+v", wc)
			}
			next = 11
		}
		noWC(t, cq)
		if err := a.send(t, b, 0, 60, 7, WRSend); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != next || wc.ByteLen != GRHSize+60 {
			t.Fatalf("srq=%v: datagram after the dropped one: %+v", useSRQ, wc)
		}
		noWC(t, cq)
		if st := qp.State(); st != QPSRTS {
			t.Fatalf("srq=%v: UD QP in %v at the end (%v)", useSRQ, st, qp.Err())
		}
	}
}

func netipFrom4(a [4]byte) netip.Addr { return netip.AddrFrom4(a) }

// TestUDOverPortMTUDropped: a UD datagram whose payload is longer than
// the receiving port's MTU (DeviceConfig.PortMTU) is malformed — UD is
// one packet of at most the path MTU, and PostSend refuses longer ones —
// so it is dropped and counted (ud_mtu_exceeded) however large the
// receive WQE, before a WQE is taken: no completion, the WQE (of the QP
// or of its SRQ) takes the next datagram, the QP stays in RTS. A
// datagram of exactly the MTU is delivered when the WQE has room for it
// and the 40-byte GRH, and not otherwise (ud_msgs_dropped).
func TestUDOverPortMTUDropped(t *testing.T) {
	for _, useSRQ := range []bool{false, true} {
		n := memnet.NewMemNetwork(memnet.Faults{})
		// The sender's port MTU is 4096: it may send what b's (1024) may not.
		a := newUDSide(t, n, [4]byte{192, 0, 2, 1}, 7, DeviceConfig{PortMTU: MTU4096})
		l, err := n.Link(netipFrom4([4]byte{192, 0, 2, 2}))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := NewDevice(l, DeviceConfig{PortMTU: MTU1024})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dev.Close() })
		pd, _ := dev.AllocPD()
		cq, _ := dev.CreateCQ(64)
		ia := QPInitAttr{Type: QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 8, MaxRecvWR: 8}
		var srq *SRQ
		if useSRQ {
			if srq, err = dev.CreateSRQ(pd, SRQAttr{MaxWR: 8}); err != nil {
				t.Fatal(err)
			}
			ia.SRQ = srq
		}
		qp, err := dev.CreateQP(pd, ia)
		if err != nil {
			t.Fatal(err)
		}
		if err := qp.ReadyUD(7, 0); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4*8192)
		mr, _ := pd.RegisterMR(buf, memreg.AccessLocalWrite)
		post := func(wrid uint64, off, n int) {
			t.Helper()
			wr := RecvWR{WRID: wrid, SGEs: []memreg.SGE{mr.SGE(uint64(off), uint32(n))}}
			if useSRQ {
				err = srq.PostRecv(wr)
			} else {
				err = qp.PostRecv(wr)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		post(10, 0, 8192) // room for any datagram the link carries
		post(11, 8192, GRHSize+1023)
		post(12, 16384, GRHSize+1024)
		b := &udSide{side: &side{dev: dev, pd: pd, scq: cq, rcq: cq, qp: qp}, buf: buf, mr: mr}
		fill(a.buf[:4096], 9)
		drops := func() uint64 { return dev.Counters().UDMTUExceeded }
		for i, size := range []int{1025, 4096} {
			if err := a.send(t, b, 0, size, 7, WRSend); err != nil {
				t.Fatal(err)
			}
			waitWC(t, a.scq, 1, 5*time.Second)
			deadline := time.Now().Add(5 * time.Second)
			for drops() < uint64(i+1) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if c := drops(); c != uint64(i+1) {
				t.Fatalf("srq=%v: %d-byte datagram at port MTU 1024: ud_mtu_exceeded = %d, want %d", useSRQ, size, c, i+1)
			}
		}
		noWC(t, cq)
		if c := dev.Counters(); c.UDMsgsDropped != 0 || c.RDMARecvs != 0 {
			t.Fatalf("srq=%v: ud_msgs_dropped %d rdma_recvs %d, want 0 0", useSRQ, c.UDMsgsDropped, c.RDMARecvs)
		}
		if st := qp.State(); st != QPSRTS {
			t.Fatalf("srq=%v: UD QP in %v (%v)", useSRQ, st, qp.Err())
		}
		// Exactly the MTU: delivered into the WQE the dropped ones did not take.
		if err := a.send(t, b, 0, 1024, 7, WRSend); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != 10 || wc.ByteLen != GRHSize+1024 {
			t.Fatalf("srq=%v: 1024-byte datagram: %+v", useSRQ, wc)
		}
		if !bytes.Equal(buf[GRHSize:GRHSize+1024], a.buf[:1024]) {
			t.Fatalf("srq=%v: payload differs", useSRQ)
		}
		// A WQE one byte short of MTU + GRH: not delivered (ud_msgs_dropped).
		if err := a.send(t, b, 0, 1024, 7, WRSend); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for dev.Counters().UDMsgsDropped == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if c := dev.Counters(); c.UDMsgsDropped != 1 || c.UDMTUExceeded != 2 {
			t.Fatalf("srq=%v: ud_msgs_dropped %d ud_mtu_exceeded %d, want 1 2", useSRQ, c.UDMsgsDropped, c.UDMTUExceeded)
		}
		if useSRQ {
			// The SRQ's WQE too short completes in error (class E), as
			// in TestUDOversizedDropped; the next one takes the retry.
			if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.Status != WCRemInvReqErr || wc.WRID != 11 {
				t.Fatalf("srq: the short WQE: %+v", wc)
			}
			if err := a.send(t, b, 0, 1024, 7, WRSend); err != nil {
				t.Fatal(err)
			}
			if wc := waitWC(t, cq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.WRID != 12 || wc.ByteLen != GRHSize+1024 {
				t.Fatalf("srq: MTU datagram into an MTU+GRH WQE: %+v", wc)
			}
		}
		noWC(t, cq)
	}
}
