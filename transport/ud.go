package transport

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
)

// GRHSize is the space at the start of a UD receive buffer that holds the
// Global Route Header, as verbs delivers it on RoCEv2: for IPv6 the IPv6
// header, for IPv4 twenty zero bytes and then the IPv4 header. A UD
// receive WQE must have room for it and the payload.
const GRHSize = 40

// ControlledQKey is the high bit of a Q_Key: a WR whose RemoteQKey has it
// set is sent with the QP's own Q_Key (IBTA 10.2.5); a QP's own Q_Key may
// have it set only on privileged QPs (QP1).
const ControlledQKey = 0x80000000

// GSIQKey is the Q_Key of QP1, the General Services Interface.
const GSIQKey = 0x80010000

// AHAttr describes the path to a UD peer (ibv_ah_attr on RoCEv2).
type AHAttr struct {
	// Addr is the peer's IP address (IPv4, IPv6 or an IPv4-mapped GID).
	Addr netip.Addr
	// TrafficClass is the IP TOS / traffic class to send with.
	TrafficClass uint8
}

// AH is an address handle: the destination of UD send work requests. It
// is a small immutable value object, safe for concurrent use.
type AH struct {
	dev  *Device
	addr netip.Addr
	tc   uint8
}

// CreateAH creates an address handle for UD sends to a.Addr.
func (d *Device) CreateAH(a AHAttr) (*AH, error) {
	if d.isClosed() {
		return nil, ErrClosed
	}
	pa := a.Addr.Unmap()
	if !pa.IsValid() || pa.IsUnspecified() {
		return nil, errorf(ErrInvalidConfig, "CreateAH: address %v", a.Addr)
	}
	if pa.Is4() != d.addr.Is4() {
		return nil, errorf(ErrInvalidConfig, "CreateAH: address %v is not in the device's address family (%v)", a.Addr, d.addr)
	}
	return &AH{dev: d, addr: pa, tc: a.TrafficClass}, nil
}

// Addr returns the AH's destination address.
func (ah *AH) Addr() netip.Addr { return ah.addr }

// AHFromGRH returns the attributes of an address handle that answers the
// sender of a UD datagram, from the GRH space of its receive buffer (the
// first GRHSize bytes; the WC has WCGRH), as ibv_init_ah_from_wc does.
func AHFromGRH(grh []byte) (AHAttr, error) {
	if len(grh) < GRHSize {
		return AHAttr{}, fmt.Errorf("transport: AHFromGRH: %d bytes, want %d: %w", len(grh), GRHSize, ErrInvalidConfig)
	}
	if grh[20]>>4 == 4 { // an IPv4 header in the last 20 bytes
		var a [4]byte
		copy(a[:], grh[20+12:20+16])
		return AHAttr{Addr: netip.AddrFrom4(a), TrafficClass: grh[20+1]}, nil
	}
	if grh[0]>>4 == 6 {
		var a [16]byte
		copy(a[:], grh[8:24])
		tc := grh[0]<<4 | grh[1]>>4
		return AHAttr{Addr: netip.AddrFrom16(a), TrafficClass: tc}, nil
	}
	return AHAttr{}, fmt.Errorf("transport: AHFromGRH: no IPv4 or IPv6 header: %w", ErrInvalidConfig)
}

// writeGRH fills the GRH space of a UD receive buffer for a datagram of
// udpLen bytes (UDP payload: BTH .. ICRC) from src to dst with traffic
// class tos, as verbs delivers it: the IP header rebuilt (the socket does
// not show the received one; the identification is 0 and the TTL 64, what
// rxe and this stack send).
func writeGRH(g *[GRHSize]byte, src, dst netip.Addr, tos uint8, udpLen int) {
	*g = [GRHSize]byte{}
	if src.Is4() {
		h := g[20:]
		h[0] = 0x45
		h[1] = tos
		binary.BigEndian.PutUint16(h[2:], uint16(20+8+udpLen))
		binary.BigEndian.PutUint16(h[6:], 0x4000) // DF
		h[8] = 64
		h[9] = 17
		s, d := src.As4(), dst.As4()
		copy(h[12:16], s[:])
		copy(h[16:20], d[:])
		var sum uint32
		for i := 0; i < 20; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
		for sum>>16 != 0 {
			sum = sum&0xffff + sum>>16
		}
		binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
		return
	}
	g[0] = 0x60 | tos>>4
	g[1] = tos << 4
	binary.BigEndian.PutUint16(g[4:], uint16(8+udpLen))
	g[6] = 17
	g[7] = 64
	s, d := src.As16(), dst.As16()
	copy(g[8:24], s[:])
	copy(g[24:40], d[:])
}

// checkUDWR checks what a UD send WR needs beyond the common checks.
func (qp *QP) checkUDWR(i int, wr *SendWR, total uint64) error {
	bad := func(field string, format string, args ...any) error {
		return &WRError{Op: "PostSend", QPN: qp.qpn, Index: i, WRID: wr.WRID, Field: field,
			Msg: fmt.Sprintf(format, args...), Kind: ErrInvalidWR}
	}
	switch {
	case wr.Opcode != WRSend && wr.Opcode != WRSendImm:
		return bad("opcode", "%v on a UD QP (only SEND and SEND_WITH_IMM)", wr.Opcode)
	case wr.AH == nil:
		return bad("ah", "nil address handle")
	case wr.AH.dev != qp.dev:
		return bad("ah", "address handle of another device")
	case wr.RemoteQPN > bth.PSNMask || wr.RemoteQPN == 0:
		return bad("remote_qpn", "%#x", wr.RemoteQPN)
	case total > uint64(qp.dev.cfg.PortMTU.Bytes()):
		return bad("sg_list", "length %d > port MTU %d", total, qp.dev.cfg.PortMTU.Bytes())
	}
	return nil
}

// udProgress sends every posted UD WQE, one packet each, and completes it:
// UD has no acknowledgements. Called with qp.mu held.
func (qp *QP) udProgress() {
	if qp.attr.State != QPSRTS {
		return
	}
	for qp.sqCur != qp.sqEnd {
		w := qp.sqAt(qp.sqCur)
		f := &qp.reqF
		*f = packet.Fields{}
		f.BTH.Opcode = bth.UDSendOnly
		if w.wr.Opcode == WRSendImm {
			f.BTH.Opcode = bth.UDSendOnlyImm
			f.Imm = w.wr.Imm
		}
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = w.wr.RemoteQPN
		f.BTH.PSN = qp.req.psn
		// rxe's GSI sends its MADs with AckReq set; user UD datagrams
		// go without it (both seen in the golden captures).
		f.BTH.AckReq = qp.qpn == 1
		f.BTH.SolicitedEvent = w.wr.Flags&SendSolicited != 0
		qkey := w.wr.RemoteQKey
		if qkey&ControlledQKey != 0 {
			qkey = qp.attr.QKey
		}
		f.DETH.QKey = qkey
		f.DETH.SrcQP = qp.qpn
		buf := qp.outBufN(packet.Len(f.BTH.Opcode, int(w.length)))
		if w.length > 0 {
			hdr := bth.Size + f.BTH.Opcode.Info().HeaderLen
			slot := buf[hdr : hdr+int(w.length)]
			if err := qp.pd.Gather(w.sges, 0, slot); err != nil {
				qp.failWQE(w, WCLocProtErr)
				return
			}
			f.Payload = slot
		}
		n, err := packet.Build(buf, f)
		if err != nil {
			qp.failWQE(w, WCLocQPOpErr)
			return
		}
		qp.commitTo(n, w.wr.AH.addr, qp.srcPort, w.wr.AH.tc)
		qp.req.psn = qp.req.psn.Add(1)
		qp.sqCur++
		w.done = true
		inc(&qp.dev.ctr.RDMASends)
		qp.completeSend(w, WCSuccess)
		qp.sqHead++
	}
}

// udInput handles a datagram for a UD QP in RTR or RTS: length (at most
// the port MTU) and Q_Key checks, receive WQE (room for the GRH and the
// payload), GRH and payload placement, completion. A datagram that cannot
// be delivered is dropped and counted; UD never NAKs.
func (qp *QP) udInput(p *packetT, up *udp.Packet) {
	if p.Info.Kind != bth.KindSend || p.DETH == nil {
		inc(&qp.dev.ctr.TransportMismatch)
		return
	}
	if len(p.Payload) > qp.dev.cfg.PortMTU.Bytes() {
		// A UD message is one packet of at most the path MTU (PostSend
		// refuses longer ones): this one is malformed. Dropped before a
		// receive WQE is taken, so that it neither completes one nor
		// holds one back, however large the WQEs posted. rxe checks only
		// the receive WQE's room (rxe_resp_check_length), an RNIC's port
		// drops what exceeds its MTU.
		inc(&qp.dev.ctr.UDMTUExceeded)
		return
	}
	if p.DETH.QKey() != qp.attr.QKey {
		inc(&qp.dev.ctr.QKeyViolation)
		return
	}
	rw := qp.nextRecv()
	if rw == nil {
		// No receive WQE: the datagram is lost (rxe counts it the same way).
		inc(&qp.dev.ctr.UDNoRecvWQE)
		return
	}
	n := uint64(len(p.Payload))
	if GRHSize+n > rw.length {
		// Longer than the receive WQE (with its GRH): not delivered, and
		// the QP stays in RTS, so a sender cannot stop a UD service with
		// one datagram; counted in ud_msgs_dropped. As rxe's
		// RESPST_ERR_LENGTH: on the QP's own receive queue the datagram
		// is dropped and the WQE stays for the next one (class D); a WQE
		// taken from an SRQ completes with a remote invalid request error
		// (class E) — kept, it would stay this QP's and turn away every
		// later datagram longer than it, while larger WQEs wait in the SRQ.
		inc(&qp.dev.ctr.UDMsgsDropped)
		if qp.srq == nil {
			return
		}
		wc := WC{WRID: rw.wrid, Opcode: WCRecv, QPN: qp.qpn, SrcQP: p.DETH.SrcQP(), Status: WCRemInvReqErr}
		qp.consumeRecv()
		qp.pushWC(qp.recvCQ, &wc, false)
		return
	}
	wc := WC{WRID: rw.wrid, Opcode: WCRecv, QPN: qp.qpn, SrcQP: p.DETH.SrcQP(),
		Flags: WCGRH | WCWithNetworkHdrType, NetworkHdrType: NetworkIPv4}
	src := up.Addr.Unmap()
	if !src.Is4() {
		wc.NetworkHdrType = NetworkIPv6
	}
	var g [GRHSize]byte
	writeGRH(&g, src, qp.dev.addr, up.TOS, len(up.Buf))
	err := qp.pd.Scatter(rw.sges, 0, g[:])
	if err == nil && n > 0 {
		err = qp.pd.Scatter(rw.sges, GRHSize, p.Payload)
	}
	if err != nil {
		wc.Status = WCLocProtErr
	}
	wc.ByteLen = uint32(GRHSize + n)
	if p.Info.Imm {
		wc.Flags |= WCWithImm
		wc.Imm = p.ImmDt.Imm()
	}
	qp.consumeRecv()
	inc(&qp.dev.ctr.RDMARecvs)
	qp.pushWC(qp.recvCQ, &wc, p.BTH.SolicitedEvent())
	if wc.Status != WCSuccess {
		// A local error on the receive queue moves a UD QP to ERR too.
		qp.fail(EventQPFatal, &WCError{Status: wc.Status, Opcode: WCRecv, WRID: wc.WRID, QPN: qp.qpn})
	}
}

// udpSourcePortUD is the UDP source port of a UD QP's datagrams: rxe's
// per-QP port, not a per-flow one (seen in the golden captures).
func udSourcePort(qpn uint32) uint16 { return udp.SourcePort(qpn) }
