package oob

import (
	"fmt"
	"net"
)

// PerfDestSize is the length of perftest's QP data message with a GID
// (KEY_MSG_SIZE_GID): "%04x:%04x:%06x:%06x:%08x:%016llx:" + 16×"%02x:" +
// "%08x:" + NUL.
const PerfDestSize = 108

// Offsets in the perftest QP data message.
const (
	pdLIDOff      = 0  // 4 hex
	pdOutReadsOff = 5  // 4 hex
	pdQPNOff      = 10 // 6 hex
	pdPSNOff      = 17 // 6 hex
	pdRKeyOff     = 24 // 8 hex
	pdVAddrOff    = 33 // 16 hex
	pdGIDOff      = 50 // 16 × "xx:"
	pdSRQNOff     = 98 // 8 hex
	pdNulOff      = 107
	pdMsgName     = "perftest qp data"
)

// PerfDest is perftest's struct pingpong_dest as exchanged over TCP: the
// peer's LID, outstanding RDMA reads/atomics it accepts, QP number, first PSN,
// rkey and address of its buffer, GID and SRQ number.
type PerfDest struct {
	LID      uint16
	OutReads uint16
	QPN      uint32 // 24 bits
	PSN      uint32 // 24 bits
	RKey     uint32
	VAddr    uint64
	GID      [16]byte
	SRQN     uint32
}

// perfFields lists the fixed-width hex fields for Encode and Parse.
var perfFields = [...]struct {
	name string
	off  int
	n    int
}{
	{"lid", pdLIDOff, 4},
	{"out_reads", pdOutReadsOff, 4},
	{"qpn", pdQPNOff, 6},
	{"psn", pdPSNOff, 6},
	{"rkey", pdRKeyOff, 8},
	{"vaddr", pdVAddrOff, 16},
	{"srqn", pdSRQNOff, 8},
}

// Validate reports whether d fits the message format (QPN and PSN are 24-bit).
func (d PerfDest) Validate() error {
	if d.QPN > 0xffffff {
		return &ParseError{Message: pdMsgName, Field: "qpn", Detail: fmt.Sprintf("%#x does not fit 24 bits", d.QPN)}
	}
	if d.PSN > 0xffffff {
		return &ParseError{Message: pdMsgName, Field: "psn", Detail: fmt.Sprintf("%#x does not fit 24 bits", d.PSN)}
	}
	return nil
}

func (d PerfDest) values() [len(perfFields)]uint64 {
	return [...]uint64{uint64(d.LID), uint64(d.OutReads), uint64(d.QPN), uint64(d.PSN),
		uint64(d.RKey), d.VAddr, uint64(d.SRQN)}
}

// Encode writes the 108-byte message (lid:out_reads:qpn:psn:rkey:vaddr:gid
// bytes:srqn:, NUL-terminated, lower-case hex, as perftest's
// ethernet_write_keys) into b, which must be at least PerfDestSize long. QPN
// and PSN are truncated to 24 bits; see Validate.
func (d PerfDest) Encode(b []byte) {
	b = b[:PerfDestSize]
	vals := d.values()
	for i, f := range perfFields {
		putHex(b[f.off:f.off+f.n], vals[i])
		b[f.off+f.n] = ':'
	}
	for i, c := range d.GID {
		o := pdGIDOff + 3*i
		b[o] = hexDigits[c>>4]
		b[o+1] = hexDigits[c&0xf]
		b[o+2] = ':'
	}
	b[pdNulOff] = 0
}

// Marshal returns the 108-byte message for d.
func (d PerfDest) Marshal() []byte {
	b := make([]byte, PerfDestSize)
	d.Encode(b)
	return b
}

// String formats d like perftest's "local address:" lines.
func (d PerfDest) String() string {
	return fmt.Sprintf("LID %04x OUT %#x QPN %#06x PSN %#06x RKey %#08x VAddr %#016x GID %s SRQN %#x",
		d.LID, d.OutReads, d.QPN, d.PSN, d.RKey, d.VAddr, net.IP(d.GID[:]), d.SRQN)
}

// ParsePerfDest parses a 108-byte perftest QP data message. It is strict about
// the layout perftest produces (fixed field widths, ':' after every field,
// trailing NUL) and accepts hex digits of either case.
func ParsePerfDest(b []byte) (PerfDest, error) {
	var d PerfDest
	if len(b) != PerfDestSize {
		return d, &ParseError{Message: pdMsgName, Field: "length",
			Detail: fmt.Sprintf("%d bytes, want %d", len(b), PerfDestSize)}
	}
	var vals [len(perfFields)]uint64
	for i, f := range perfFields {
		if err := expectByte(pdMsgName, f.name, " separator", b, f.off+f.n, ':'); err != nil {
			return d, err
		}
		v, err := parseHex(pdMsgName, f.name, b[f.off:f.off+f.n])
		if err != nil {
			return d, err
		}
		vals[i] = v
	}
	for i := range d.GID {
		o := pdGIDOff + 3*i
		field := gidFieldNames[i]
		if err := expectByte(pdMsgName, field, " separator", b, o+2, ':'); err != nil {
			return d, err
		}
		v, err := parseHex(pdMsgName, field, b[o:o+2])
		if err != nil {
			return d, err
		}
		d.GID[i] = byte(v)
	}
	if err := expectByte(pdMsgName, "terminator", "", b, pdNulOff, 0); err != nil {
		return d, err
	}
	d.LID = uint16(vals[0])
	d.OutReads = uint16(vals[1])
	d.QPN = uint32(vals[2])
	d.PSN = uint32(vals[3])
	d.RKey = uint32(vals[4])
	d.VAddr = vals[5]
	d.SRQN = uint32(vals[6])
	return d, nil
}

// gidFieldNames avoids formatting field names on the parse path.
var gidFieldNames = func() (n [16]string) {
	for i := range n {
		n[i] = fmt.Sprintf("gid[%d]", i)
	}
	return
}()
