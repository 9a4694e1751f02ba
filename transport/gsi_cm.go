package transport

import (
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/udp"
)

// openGSIForInput returns QP1 for a datagram addressed to it, opening the
// GSI if nothing has yet (nil once the device is closing). Receive path.
func (d *Device) openGSIForInput() *QP {
	g, err := d.GSI()
	if err != nil {
		return nil
	}
	return g.qp
}

// answerUnclaimedCM answers a CM MAD that no agent takes, as the kernel's
// CM answers one for a service nobody listens on or a connection it does
// not know: a REQ with a REJ (invalid service ID), a SIDR_REQ with a
// SIDR_REP (service ID not supported), a DREQ with a DREP. Everything
// else, and what does not decode, is left dropped.
// Called with g.qp.mu held, from GSI.input.
func (g *GSI) answerUnclaimedCM(mad []byte, up *udp.Packet) {
	h, msg, err := cm.Decode(mad)
	if err != nil {
		return
	}
	var reply cm.Message
	switch f := msg.(type) {
	case *cm.REQFields:
		reply = &cm.REJFields{RemoteCommID: f.LocalCommID, MessageRejected: cm.KindREQ, Reason: cm.RejInvalidServiceID}
	case *cm.SIDRREQFields:
		reply = &cm.SIDRREPFields{RequestID: f.RequestID, ServiceID: f.ServiceID, Status: cm.SIDRUnsupported}
	case *cm.DREQFields:
		// A DREQ for a connection this device does not know (its
		// process restarted, say): a DREP, as cm.c answers a stray
		// DREQ, so that the peer stops sending it and ends its side.
		reply = &cm.DREPFields{LocalCommID: f.RemoteCommID, RemoteCommID: f.LocalCommID}
	default:
		return
	}
	var out [MADSize]byte
	rh := cm.NewHeader(0, h.TransactionID)
	if cm.Encode(out[:], &rh, reply) != nil {
		return
	}
	src := up.Addr.Unmap()
	if !src.IsValid() || src.Is4() != g.dev.addr.Is4() || g.dev.isClosed() {
		return
	}
	_ = g.sendLocked(src, 1, up.TOS, out[:])
}
