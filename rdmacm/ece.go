package rdmacm

import (
	"fmt"

	"github.com/gorocev2/rocev2/cm"
)

// Enhanced Connection Establishment (ECE, IBTA vol. 1 1.4; Linux's
// rdma_set_local_ece / rdma_get_remote_ece): a REQ and a REP carry a
// 24-bit vendor ID in the reserved bytes the IBTA gave it (cm.REQFields
// and cm.REPFields VendorID) and the vendor's option bits in the MAD
// header's AttributeModifier. This package uses it for one option,
// selective repeat:
//
//   - A side dialing with Options.SelectiveRepeat puts VendorID and
//     ECESelectiveRepeat in its REQ.
//   - A side accepting with Options.SelectiveRepeat answers a REQ that
//     carries VendorID with the SelectiveRepeat bit by putting both in its
//     REP, and readies its QP for selective repeat.
//   - The dialing side readies its QP for selective repeat only when the
//     REP carries VendorID with the bit. A REP without it (rxe, a
//     hardware RNIC, a rocev2 peer not asked for it) leaves go-back-N.
//
// Without Options.SelectiveRepeat nothing changes on the wire: the REQ
// and REP carry vendor ID 0 and AttributeModifier 0, as before; and a REQ
// from rxe (which sends no ECE unless its application sets one) is never
// answered with one.

// VendorID is the ECE vendor ID of this stack: 0x5a5352, a value in the
// IEEE's locally administered (CID) space (bit 1 of the first byte set),
// so it cannot collide with a company's assigned OUI.
const VendorID = 0x5a5352

// ECE option bits (the AttributeModifier of a REQ or REP with VendorID).
const (
	// ECESelectiveRepeat: selective repeat (transport.QPAttr.SelectiveRepeat).
	ECESelectiveRepeat uint32 = 1 << 0
)

// ECE is an Enhanced Connection Establishment value: a vendor ID and its
// option bits (Linux's struct ibv_ece vendor_id and options).
type ECE struct {
	VendorID uint32
	Options  uint32
}

// String describes e, e.g. "vendor 0x5a5352 options 0x1 (selective repeat)".
func (e ECE) String() string {
	if e.VendorID == 0 && e.Options == 0 {
		return "none"
	}
	s := fmt.Sprintf("vendor %#06x options %#x", e.VendorID, e.Options)
	if e.VendorID == VendorID && e.Options&ECESelectiveRepeat != 0 {
		s += " (selective repeat)"
	}
	return s
}

// offersSR reports whether e asks for selective repeat.
func (e ECE) offersSR() bool { return e.VendorID == VendorID && e.Options&ECESelectiveRepeat != 0 }

// eceMod returns the AttributeModifier of msg: the local ECE options for a
// REQ or REP, else 0.
func (c *Conn) eceMod(msg cm.Message) uint32 {
	switch msg.AttributeID() {
	case cm.AttrREQ, cm.AttrREP:
		if c.localECE.VendorID != 0 {
			return c.localECE.Options
		}
	}
	return 0
}

// LocalECE returns what this side sent in its REQ or REP (zero: no ECE).
func (c *Conn) LocalECE() ECE { return c.localECE }

// RemoteECE returns what the peer sent in its REQ or REP (zero: no ECE).
func (c *Conn) RemoteECE() ECE { return c.remoteECE }

// SelectiveRepeat reports whether the connection's QP runs selective
// repeat (both sides asked for it and the ECE exchange agreed).
func (c *Conn) SelectiveRepeat() bool { return c.qp != nil && c.qp.SelectiveRepeat() }
