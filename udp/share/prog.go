//go:build linux

package share

import (
	"github.com/cilium/ebpf/asm"
)

// Return codes of an SK_REUSEPORT program.
const (
	skDrop = 0
	skPass = 1
)

// Offsets in the datagram as the program sees it: its data starts at the
// UDP header.
const (
	offDestQP = 8 + 5      // BTH DestQP (24 bits)
	offMAD    = 8 + 12 + 8 // MAD after the UDP header, BTH and DETH (QP1 is UD)
	madLoad   = 24 + 16    // MAD header and the first 16 bytes of the CM message
	madClass  = 1          // management class
	madAttr   = 16         // attribute ID (big-endian 16 bits)
	cmData    = 24         // CM message data
	classCM   = 0x07       // the CM management class
	tagBit    = 0x80       // set in the top byte of an owned communication ID
	slotMask  = 0x7f       // member slot in the top byte of a communication ID
	bthPrefix = 8 + 12     // UDP header and BTH
	rangeBits = 12         // QPNs per range: 1 << rangeBits
	numRanges = 1 << (24 - rangeBits)
)

// CM attribute IDs (IBTA 12.6; package cm has them as MsgKind).
const (
	attrREQ     = 0x10
	attrMRA     = 0x11
	attrREJ     = 0x12
	attrREP     = 0x13
	attrRTU     = 0x14
	attrDREQ    = 0x15
	attrDREP    = 0x16
	attrSIDRREQ = 0x17
	attrSIDRREP = 0x18
	attrLAP     = 0x19
	attrAPR     = 0x1a
)

// Counter indices of the stats map after the MaxMembers per-member
// "steered" counters.
const (
	ctrUnownedQPN  = iota // packets for a QPN range no member owns
	ctrDeadOwner          // the owner's socket is gone (closed, crashed)
	ctrNoListener         // REQ/SIDR_REQ for an unlistened service and no rejector
	ctrUnownedComm        // CM reply whose communication ID carries no owner
	ctrNotCM              // QP1 packet that is not a CM MAD we route
	ctrMalformed          // too short to read the headers
	ctrToRejector         // REQ/SIDR_REQ for an unlistened service, sent to the rejector
	numGroupCounters
)

// Stack layout (offsets from R10).
const (
	fpKey   = -4  // u32 map key
	fpSlot  = -8  // u32 selected member slot
	fpHdr   = -32 // 20 bytes: UDP header + BTH (up to -12)
	fpMAD   = -72 // 40 bytes: MAD header + CM data (up to -32)
	fpCtrIx = -76 // u32 counter key
)

// be16 returns the register value a 2-byte load yields for big-endian v.
func be16(v uint16) int32 { return int32(v>>8 | v<<8&0xff00) }

// count emits stats[key] += 1 where key is in register reg, or the
// constant imm when reg is asm.RFP. Clobbers R0-R5.
func count(statsFD int, reg asm.Register, imm int32, label string) asm.Instructions {
	ins := asm.Instructions{}
	if reg == asm.RFP {
		ins = append(ins, asm.StoreImm(asm.RFP, fpCtrIx, int64(imm), asm.Word))
	} else {
		ins = append(ins, asm.StoreMem(asm.RFP, fpCtrIx, reg, asm.Word))
	}
	add := asm.AddAtomic.Mem(asm.R0, asm.R1, asm.DWord, 0)
	add.Constant = int64(asm.AddAtomic >> 8)
	return append(ins,
		asm.LoadMapPtr(asm.R1, statsFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpCtrIx),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, label),
		asm.Mov.Imm(asm.R1, 1),
		add,
	)
}

// dropWith emits: count group counter c, return SK_DROP.
func dropWith(statsFD int, c int, sym string) asm.Instructions {
	lbl := sym + "_ret"
	ins := count(statsFD, asm.RFP, int32(MaxMembers+c), lbl)
	ins[0] = ins[0].WithSymbol(sym)
	return append(ins, asm.Mov.Imm(asm.R0, skDrop).WithSymbol(lbl), asm.Return())
}

// program returns the steering program's instructions for the given maps.
//
// A datagram to the group goes to the member that owns it:
//   - DestQP 1 (the GSI): a CM REQ or SIDR_REQ to the member listening on
//     its service ID (services map), else to the rejector (cfg[cfgRejector]),
//     which answers with one REJ; every other CM message to the member whose
//     slot is in the top byte of the communication ID it is addressed to
//     (RemoteCommID; the RequestID of a SIDR_REP);
//   - any other DestQP to the owner of its QPN range (ranges map).
//
// Everything else is dropped and counted, never handed to another member
// (a failed bpf_sk_select_reuseport returns SK_DROP: SK_PASS would let the
// kernel pick a socket by hash).
func program(socksFD, rangesFD, servicesFD, cfgFD, statsFD, identFD int) asm.Instructions {
	p := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		// The ident map is not read; referring to it keeps it alive as
		// long as the program (so it finds the group: findLive).
		asm.LoadMapPtr(asm.R2, identFD),
		// UDP header + BTH.
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpHdr),
		asm.Mov.Imm(asm.R4, bthPrefix),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "malformed"),
		asm.LoadMem(asm.R7, asm.RFP, fpHdr+offDestQP, asm.Byte),
		asm.LSh.Imm(asm.R7, 16),
		asm.LoadMem(asm.R2, asm.RFP, fpHdr+offDestQP+1, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.Or.Reg(asm.R7, asm.R2),
		asm.LoadMem(asm.R2, asm.RFP, fpHdr+offDestQP+2, asm.Byte),
		asm.Or.Reg(asm.R7, asm.R2),
		asm.JEq.Imm(asm.R7, 1, "gsi"),
		// QPN range owner.
		asm.RSh.Imm(asm.R7, rangeBits),
		asm.StoreMem(asm.RFP, fpKey, asm.R7, asm.Word),
		asm.LoadMapPtr(asm.R1, rangesFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "unowned"),
		asm.LoadMem(asm.R8, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R8, 0, "unowned"),
		asm.Sub.Imm(asm.R8, 1),
		asm.Ja.Label("select"),

		// QP1: read the MAD header and the start of the CM message.
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("gsi"),
		asm.Mov.Imm(asm.R2, offMAD),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpMAD),
		asm.Mov.Imm(asm.R4, madLoad),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "malformed"),
		asm.LoadMem(asm.R2, asm.RFP, fpMAD+madClass, asm.Byte),
		asm.JNE.Imm(asm.R2, classCM, "notcm"),
		asm.LoadMem(asm.R2, asm.RFP, fpMAD+madAttr, asm.Half),
		asm.JEq.Imm(asm.R2, be16(attrREQ), "service"),
		asm.JEq.Imm(asm.R2, be16(attrSIDRREQ), "service"),
		asm.JEq.Imm(asm.R2, be16(attrSIDRREP), "reqid"),
		asm.JEq.Imm(asm.R2, be16(attrMRA), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrREJ), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrREP), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrRTU), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrDREQ), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrDREP), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrLAP), "remoteid"),
		asm.JEq.Imm(asm.R2, be16(attrAPR), "remoteid"),
		asm.Ja.Label("notcm"),

		// The communication ID's top byte names the owner.
		asm.LoadMem(asm.R8, asm.RFP, fpMAD+cmData+4, asm.Byte).WithSymbol("remoteid"),
		asm.Ja.Label("tag"),
		asm.LoadMem(asm.R8, asm.RFP, fpMAD+cmData, asm.Byte).WithSymbol("reqid"),
		asm.Mov.Reg(asm.R2, asm.R8).WithSymbol("tag"),
		asm.And.Imm(asm.R2, tagBit),
		asm.JEq.Imm(asm.R2, 0, "unownedcomm"),
		asm.And.Imm(asm.R8, slotMask),
		asm.Ja.Label("select"),

		// REQ and SIDR_REQ: the listener of the service ID (8 bytes at
		// CM data offset 8 in both, big-endian, the map key as is).
		asm.LoadMapPtr(asm.R1, servicesFD).WithSymbol("service"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpMAD+cmData+8),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "rejector"),
		asm.LoadMem(asm.R8, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R8, 0, "rejector"),
		asm.Sub.Imm(asm.R8, 1),
		asm.Ja.Label("select"),
		asm.StoreImm(asm.RFP, fpKey, cfgRejector, asm.Word).WithSymbol("rejector"),
		asm.LoadMapPtr(asm.R1, cfgFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "nolistener"),
		asm.LoadMem(asm.R8, asm.R0, 0, asm.Word),
		asm.JEq.Imm(asm.R8, 0, "nolistener"),
		asm.Sub.Imm(asm.R8, 1),
	}
	p = append(p, count(statsFD, asm.RFP, MaxMembers+ctrToRejector, "select")...)

	// Hand the datagram to the socket of member R8.
	p = append(p,
		asm.StoreMem(asm.RFP, fpSlot, asm.R8, asm.Word).WithSymbol("select"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMapPtr(asm.R2, socksFD),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpSlot),
		asm.Mov.Imm(asm.R4, 0),
		asm.FnSkSelectReuseport.Call(),
		asm.JNE.Imm(asm.R0, 0, "dead"),
		asm.LoadMem(asm.R8, asm.RFP, fpSlot, asm.Word),
	)
	p = append(p, count(statsFD, asm.R8, 0, "pass")...)
	p = append(p, asm.Mov.Imm(asm.R0, skPass).WithSymbol("pass"), asm.Return())

	p = append(p, dropWith(statsFD, ctrDeadOwner, "dead")...)
	p = append(p, dropWith(statsFD, ctrUnownedQPN, "unowned")...)
	p = append(p, dropWith(statsFD, ctrUnownedComm, "unownedcomm")...)
	p = append(p, dropWith(statsFD, ctrNoListener, "nolistener")...)
	p = append(p, dropWith(statsFD, ctrNotCM, "notcm")...)
	p = append(p, dropWith(statsFD, ctrMalformed, "malformed")...)
	return p
}
