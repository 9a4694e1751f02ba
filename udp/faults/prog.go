//go:build linux

package faults

import (
	"encoding/binary"

	"github.com/cilium/ebpf/asm"
)

// Return codes of a tc program (TC_ACT_* in linux/pkt_cls.h; TCX uses the
// same values: TCX_NEXT = -1, TCX_PASS = 0, TCX_DROP = 2).
const (
	actUnspec = -1 // TC_ACT_UNSPEC / TCX_NEXT: not ours, let the next program or the default decide
	actShot   = 2  // TC_ACT_SHOT / TCX_DROP
)

// Offsets of struct __sk_buff fields (linux/bpf.h).
const (
	skbLen      = 0
	skbMark     = 8
	skbIfindex  = 40
	skbGSOSegs  = 164 // Linux >= 5.1
	skbGSOSize  = 176 // Linux >= 5.7
	skbFlagsOff = 0
)

// cloneMark is written to skb->mark around bpf_clone_redirect so the clone,
// which passes the same hook again, is recognised and let through untouched.
const cloneMark = 0x72636576 // "rcev"

// dropMark is written to skb->mark of a packet dropped on an egress hook:
// the program redirects it to the same interface's egress, the sender sees
// the send succeed (a redirect is NET_XMIT_SUCCESS), and the second pass
// drops it (see shot).
const dropMark = 0x72636478 // "rcdx"

// bpfFIngress is BPF_F_INGRESS for bpf_clone_redirect.
const bpfFIngress = 1

// holdMax is the largest frame (Ethernet header included) the reorder slot
// can hold; larger frames are never held.
const holdMax = 9216 + 64

// Layout of a config map value (one entry). All fields are native-endian
// u32 words so the program loads each with one instruction.
const (
	cfgDropThr    = 0  // random drop: drop when bpf_get_prandom_u32() < thr
	cfgEveryN     = 4  // drop every Nth matching packet (0 = off)
	cfgPSNFirst   = 8  // PSN range start
	cfgPSNSpan    = 12 // (last - first) & 0xffffff
	cfgPSNLimit   = 16 // at most this many PSN-range drops (0 = unlimited)
	cfgDupThr     = 20 // duplicate threshold
	cfgReorderThr = 24 // hold-and-release threshold
	cfgCEThr      = 28 // CE marking threshold
	cfgFlags      = 32 // flagPSN, flagCEAll, flagDestQP, flagCong, flagCongMark
	cfgDestQP     = 36 // only packets to this BTH DestQP (flagDestQP)
	// Congestion point (flagCong); see Congestion. Time in the phantom
	// queue is kept in units of 2^-qTimeShift ns since cfgQBase.
	cfgQNsPerByte  = 40 // u64: ns per IP byte << qTimeShift
	cfgQBytesPerNs = 48 // u64: IP bytes per ns << 32
	cfgQBase       = 56 // u64: bpf_ktime_get_ns() origin of the queue clock
	cfgQLimit      = 64 // u32: tail drop above this many bytes
	cfgQKmin       = 68 // u32: marking starts above this depth (bytes)
	cfgQKmax       = 72 // u32: marking is certain from this depth (bytes)
	cfgQSlope      = 80 // u64: Pmax·2^48/(Kmax−Kmin): mark threshold per byte above Kmin, << 16
	// cfgZero is always 0: the GSO path starts its per-segment tallies
	// from it, so the verifier sees them as unknown numbers (not constants
	// it would have to track exactly in every unrolled segment).
	cfgZero = 88 // u64
	cfgSize = 96

	flagPSN      = 1 << 0
	flagCEAll    = 1 << 1
	flagDestQP   = 1 << 2
	flagCong     = 1 << 3
	flagCongMark = 1 << 4

	// qTimeShift scales the phantom queue's clock: 1/16384 ns resolution,
	// 2^50 ns (13 days) of range after Load.
	qTimeShift = 14
)

// Layout of a state map value (one entry per attach direction).
const (
	stCounters  = 0                        // nCounters u64 counters
	stSeq       = stCounters + 8*nCounters // every-Nth sequence
	stPSNDrops  = stSeq + 8                // PSN-range drops so far (for the limit)
	stQTail     = stPSNDrops + 8           // phantom queue: queue clock time at which it is empty
	stQMax      = stQTail + 8              // phantom queue: largest depth after an enqueue (bytes)
	stHoldState = stQMax + 8               // 0 empty, 1 filling, 2 full, 3 releasing
	stHoldLen   = stHoldState + 8          // bytes held
	stHoldBuf   = stHoldLen + 8            // the held frame
	stateSize   = stHoldBuf + holdMax
)

// Counter indices in the state value.
const (
	ctrSeen = iota
	ctrOther
	ctrGSO
	ctrFiltered
	ctrDropRandom
	ctrDropNth
	ctrDropPSN
	ctrDropRequests
	ctrDuplicated
	ctrHeld
	ctrReleased
	ctrCEMarked
	ctrCENotECT
	ctrErrors
	ctrOwnClones
	ctrCongPassed
	ctrCongMarked
	ctrCongDropped
	ctrGSOSegs
	ctrGSOSkipped
	ctrGSODropped
	ctrGSOMarked
	nCounters = 24
)

// Stack layout (offsets from the frame pointer R10).
const (
	fpSavedMark = -8   // u64: the skb mark before a clone
	fpFamily    = -16  // u64: 4 or 6
	fpKey       = -20  // u32 map key
	fpIP        = -64  // 40 bytes: the IPv4 or IPv6 header
	fpUDP       = -104 // 20 bytes: UDP header + BTH
	fpCong      = -112 // u64: 1 when the congestion point chose this packet for CE
	fpQLen      = -120 // u64: the packet's IP length (congestion point)
	fpQDepth    = -128 // u64: the phantom queue's depth at arrival (bytes)
)

// be16 returns the register value a 2-byte load from memory yields for the
// big-endian wire value v.
func be16(v uint16) int32 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return int32(binary.NativeEndian.Uint16(b[:]))
}

// fetchAdd emits an atomic 64-bit fetch-and-add: src = xadd(*(dst+off), src).
// ins.Constant is set explicitly (BPF_ADD | BPF_FETCH): cilium/ebpf v0.22.0
// can lose the fetch bit when marshalling atomics (TestInstructionsMarshal).
func fetchAdd(dst, src asm.Register, off int16) asm.Instruction {
	ins := asm.FetchAdd.Mem(dst, src, asm.DWord, off)
	ins.Constant = int64(asm.FetchAdd >> 8)
	return ins
}

// cmpXchg emits an atomic 64-bit compare-and-exchange: if *(dst+off) == R0
// then *(dst+off) = src; R0 = the old value. Constant set explicitly as in
// fetchAdd.
func cmpXchg(dst, src asm.Register, off int16) asm.Instruction {
	ins := asm.CmpXchg.Mem(dst, src, asm.DWord, off)
	ins.Constant = int64(asm.CmpXchg >> 8)
	return ins
}

// count emits counter[idx] += 1 on the state value in R9 (clobbers R1).
func count(idx int) asm.Instructions {
	add := asm.AddAtomic.Mem(asm.R9, asm.R1, asm.DWord, int16(stCounters+8*idx))
	add.Constant = int64(asm.AddAtomic >> 8)
	return asm.Instructions{asm.Mov.Imm(asm.R1, 1), add}
}

// loadBytes emits bpf_skb_load_bytes(skb, off, fp+dst, n); off is a
// register or, when offReg is asm.RFP, the constant offImm. Jumps to fail on
// error.
func loadBytes(offReg asm.Register, offImm int32, dst int16, n int32, fail string) asm.Instructions {
	ins := asm.Instructions{asm.Mov.Reg(asm.R1, asm.R6)}
	if offReg == asm.RFP {
		ins = append(ins, asm.Mov.Imm(asm.R2, offImm))
	} else {
		ins = append(ins, asm.Mov.Reg(asm.R2, offReg))
	}
	return append(ins,
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, int32(dst)),
		asm.Mov.Imm(asm.R4, n),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, fail),
	)
}

// random emits: if bpf_get_prandom_u32() >= cfg[thrOff] (or the threshold
// is 0) goto skip. Clobbers R0-R5.
func random(thrOff int16, skip string) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R8, thrOff, asm.Word),
		asm.JEq.Imm(asm.R2, 0, skip),
		asm.FnGetPrandomU32.Call(),
		asm.LoadMem(asm.R2, asm.R8, thrOff, asm.Word),
		asm.JGE.Reg(asm.R0, asm.R2, skip),
	}
}

// cloneOut emits bpf_clone_redirect(skb, skb->ifindex, flags) with skb->mark
// set to cloneMark for the call, and counts an error on failure. The result
// stays in R0.
func cloneOut(ingress bool) asm.Instructions {
	flags := int32(0)
	if ingress {
		flags = bpfFIngress
	}
	return asm.Instructions{
		asm.LoadMem(asm.R2, asm.R6, skbMark, asm.Word),
		asm.StoreMem(asm.RFP, fpSavedMark, asm.R2, asm.DWord),
		asm.Mov.Imm(asm.R2, cloneMark),
		asm.StoreMem(asm.R6, skbMark, asm.R2, asm.Word),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMem(asm.R2, asm.R6, skbIfindex, asm.Word),
		asm.Mov.Imm(asm.R3, flags),
		asm.FnCloneRedirect.Call(),
		asm.LoadMem(asm.R2, asm.RFP, fpSavedMark, asm.DWord),
		asm.StoreMem(asm.R6, skbMark, asm.R2, asm.Word),
	}
}

// program returns the injector's instructions for one hook. stateMapFD and
// configMapFD are loaded maps; dir is the state map key of this hook.
//
// Order of decisions for a RoCEv2 packet (UDP destination port 4791, IPv4
// or IPv6 without extension headers, not a fragment, one packet per skb):
// DestQP filter, PSN-range drop, every-Nth drop, random drop, congestion
// point (tail drop, or the choice to mark CE), release of a held packet,
// hold (reorder), CE mark, duplicate. A dropped packet is neither held,
// marked nor duplicated. A UDP GSO datagram (gso_segs > 1) takes gsoPath:
// the same rules per segment, applied to the whole datagram, then the
// release of a held packet.
func program(configMapFD, stateMapFD int, dir uint32, ingress bool) asm.Instructions {
	p := asm.Instructions{
		// The second pass of a silent egress drop (see shot).
		asm.LoadMem(asm.R2, asm.R1, skbMark, asm.Word),
		asm.JNE.Imm(asm.R2, dropMark, "start"),
		asm.Mov.Imm(asm.R0, actShot),
		asm.Return(),
		asm.Mov.Reg(asm.R6, asm.R1).WithSymbol("start"),
		// State of this direction (counters, sequence, hold slot) in R9.
		asm.StoreImm(asm.RFP, fpKey, int64(dir), asm.Word),
		asm.LoadMapPtr(asm.R1, stateMapFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "exit"),
		asm.Mov.Reg(asm.R9, asm.R0),
		// Config in R8.
		asm.StoreImm(asm.RFP, fpKey, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, configMapFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, fpKey),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "exit"),
		asm.Mov.Reg(asm.R8, asm.R0),
		// Our own clone passes untouched.
		asm.LoadMem(asm.R2, asm.R6, skbMark, asm.Word),
		asm.JNE.Imm(asm.R2, cloneMark, "parse"),
	}
	p = append(p, count(ctrOwnClones)...)
	p = append(p, asm.Ja.Label("exit"))

	// Ethernet type.
	p = append(p, sym("parse", loadBytes(asm.RFP, 12, fpIP, 2, "other"))...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpIP, asm.Half),
		asm.JEq.Imm(asm.R2, be16(0x0800), "ipv4"),
		asm.JEq.Imm(asm.R2, be16(0x86dd), "ipv6"),
		asm.Ja.Label("other"),
	)
	// IPv4: UDP, not a fragment, header length from IHL.
	p = append(p, sym("ipv4", loadBytes(asm.RFP, 14, fpIP, 20, "other"))...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpIP+9, asm.Byte),
		asm.JNE.Imm(asm.R2, 17, "other"),
		asm.LoadMem(asm.R2, asm.RFP, fpIP+6, asm.Half),
		asm.And.Imm(asm.R2, be16(0x3fff)),
		asm.JNE.Imm(asm.R2, 0, "other"),
		asm.LoadMem(asm.R7, asm.RFP, fpIP, asm.Byte),
		asm.And.Imm(asm.R7, 0x0f),
		asm.LSh.Imm(asm.R7, 2),
		asm.JLT.Imm(asm.R7, 20, "other"),
		asm.Add.Imm(asm.R7, 14),
	)
	p = append(p, store64(asm.RFP, fpFamily, 4)...)
	p = append(p, asm.Ja.Label("udp"))
	// IPv6: next header UDP directly.
	p = append(p, sym("ipv6", loadBytes(asm.RFP, 14, fpIP, 40, "other"))...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpIP+6, asm.Byte),
		asm.JNE.Imm(asm.R2, 17, "other"),
		asm.Mov.Imm(asm.R7, 54),
	)
	p = append(p, store64(asm.RFP, fpFamily, 6)...)
	// UDP header + BTH; destination port 4791.
	p = append(p, sym("udp", loadBytes(asm.R7, 0, fpUDP, 20, "other"))...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+2, asm.Half),
		asm.JNE.Imm(asm.R2, be16(4791), "other"),
		// A GSO datagram carries many RoCE packets: gsoPath.
		asm.LoadMem(asm.R2, asm.R6, skbGSOSegs, asm.Word),
		asm.JGT.Imm(asm.R2, 1, "gso"),
	)
	p = append(p, sym("roce", count(ctrSeen))...)
	p = append(p, store64(asm.RFP, fpCong, 0)...)

	// DestQP filter.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagDestQP),
		asm.JEq.Imm(asm.R2, 0, "psn"),
		asm.LoadMem(asm.R3, asm.RFP, fpUDP+8+5, asm.Byte),
		asm.LSh.Imm(asm.R3, 16),
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+8+6, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+8+7, asm.Byte),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.R8, cfgDestQP, asm.Word),
		asm.JEq.Reg(asm.R3, asm.R2, "psn"),
	)
	p = append(p, count(ctrFiltered)...)
	p = append(p, asm.Ja.Label("exit"))

	// PSN range: (psn - first) & 0xffffff <= span.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word).WithSymbol("psn"),
		asm.And.Imm(asm.R2, flagPSN),
		asm.JEq.Imm(asm.R2, 0, "nth"),
		asm.LoadMem(asm.R3, asm.RFP, fpUDP+8+9, asm.Byte),
		asm.LSh.Imm(asm.R3, 16),
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+8+10, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+8+11, asm.Byte),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNFirst, asm.Word),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xffffff),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNSpan, asm.Word),
		asm.JGT.Reg(asm.R3, asm.R2, "nth"),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNLimit, asm.Word),
		asm.JEq.Imm(asm.R2, 0, "psndrop"),
		asm.Mov.Imm(asm.R3, 1),
		fetchAdd(asm.R9, asm.R3, stPSNDrops),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNLimit, asm.Word),
		asm.JGE.Reg(asm.R3, asm.R2, "nth"),
	)
	p = append(p, sym("psndrop", count(ctrDropPSN))...)
	p = append(p, asm.Ja.Label("drop"))

	// Every Nth: drop when (++seq) % N == 0.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgEveryN, asm.Word).WithSymbol("nth"),
		asm.JEq.Imm(asm.R2, 0, "rnd"),
		asm.Mov.Imm(asm.R3, 1),
		fetchAdd(asm.R9, asm.R3, stSeq),
		asm.Add.Imm(asm.R3, 1),
		asm.Mod.Reg(asm.R3, asm.R2),
		asm.JNE.Imm(asm.R3, 0, "rnd"),
	)
	p = append(p, count(ctrDropNth)...)
	p = append(p, asm.Ja.Label("drop"))

	// Random drop.
	p = append(p, sym("rnd", random(cfgDropThr, "cong"))...)
	p = append(p, count(ctrDropRandom)...)
	p = append(p, asm.Ja.Label("drop"))

	p = append(p, congestion()...)

	// Drop; count request packets (not READ response/ACK/atomic ACK
	// 0x0d-0x12, not CNP) separately.
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpUDP+8, asm.Byte).WithSymbol("drop"),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xe0),
		asm.JEq.Imm(asm.R3, 0x80, "shot"),
		asm.And.Imm(asm.R2, 0x1f),
		asm.JLT.Imm(asm.R2, 0x0d, "dropreq"),
		asm.JLE.Imm(asm.R2, 0x12, "shot"),
	)
	p = append(p, sym("dropreq", count(ctrDropRequests))...)
	p = append(p, sym("shot", shot(ingress))...)

	// Release a held packet after this one: clone this packet out first,
	// then turn the skb into the held frame and let it go.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R9, stHoldState, asm.DWord).WithSymbol("release"),
		asm.JNE.Imm(asm.R2, 2, "reorder"),
		asm.Mov.Imm(asm.R0, 2),
		asm.Mov.Imm(asm.R3, 3),
		cmpXchg(asm.R9, asm.R3, stHoldState),
		asm.JNE.Imm(asm.R0, 2, "reorder"),
	)
	p = append(p, cloneOut(ingress)...)
	p = append(p, asm.JEq.Imm(asm.R0, 0, "morph"))
	p = append(p, count(ctrErrors)...)
	p = append(p,
		asm.Mov.Reg(asm.R1, asm.R6).WithSymbol("morph"),
		asm.LoadMem(asm.R2, asm.R9, stHoldLen, asm.DWord),
		asm.Mov.Imm(asm.R3, 0),
		asm.FnSkbChangeTail.Call(),
		asm.JNE.Imm(asm.R0, 0, "morphfail"),
		asm.LoadMem(asm.R4, asm.R9, stHoldLen, asm.DWord),
		asm.JEq.Imm(asm.R4, 0, "morphfail"),
		asm.JGT.Imm(asm.R4, holdMax, "morphfail"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R9),
		asm.Add.Imm(asm.R3, stHoldBuf),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "morphfail"),
	)
	p = append(p, store64(asm.R9, stHoldState, 0)...)
	p = append(p, count(ctrReleased)...)
	p = append(p, asm.Ja.Label("exit"))
	// The held frame is lost; this packet already left as the clone.
	p = append(p, sym("morphfail", store64(asm.R9, stHoldState, 0))...)
	p = append(p, count(ctrErrors)...)
	p = append(p, asm.Ja.Label("shot"))

	// Reorder: hold this frame in the slot (drop it now); the next packet
	// through this hook releases it behind itself.
	p = append(p, sym("reorder", random(cfgReorderThr, "ce"))...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.R6, skbLen, asm.Word),
		asm.JGT.Imm(asm.R2, holdMax, "ce"),
		asm.Mov.Imm(asm.R0, 0),
		asm.Mov.Imm(asm.R3, 1),
		cmpXchg(asm.R9, asm.R3, stHoldState),
		asm.JNE.Imm(asm.R0, 0, "ce"),
		asm.LoadMem(asm.R4, asm.R6, skbLen, asm.Word),
		asm.JEq.Imm(asm.R4, 0, "holdfail"),
		asm.JGT.Imm(asm.R4, holdMax, "holdfail"),
		asm.StoreMem(asm.R9, stHoldLen, asm.R4, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 0),
		asm.Mov.Reg(asm.R3, asm.R9),
		asm.Add.Imm(asm.R3, stHoldBuf),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "holdfail"),
	)
	p = append(p, store64(asm.R9, stHoldState, 2)...)
	p = append(p, count(ctrHeld)...)
	p = append(p, asm.Ja.Label("shot"))
	p = append(p, sym("holdfail", store64(asm.R9, stHoldState, 0))...)
	p = append(p, count(ctrErrors)...)
	p = append(p, asm.Ja.Label("exit"))

	// CE marking of ECN-capable packets (all packets with flagCEAll).
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpCong, asm.DWord).WithSymbol("ce"),
		asm.JNE.Imm(asm.R2, 0, "cemark"),
	)
	p = append(p, random(cfgCEThr, "dup")...)
	p = append(p, ceMark("", "dup", count, nil)...)

	// Duplicate: a clone leaves through the same hook now, the original
	// follows.
	p = append(p, sym("dup", random(cfgDupThr, "exit"))...)
	p = append(p, cloneOut(ingress)...)
	p = append(p, asm.JEq.Imm(asm.R0, 0, "dupok"))
	p = append(p, count(ctrErrors)...)
	p = append(p, asm.Ja.Label("exit"))
	p = append(p, sym("dupok", count(ctrDuplicated))...)
	p = append(p, asm.Ja.Label("exit"))

	p = append(p, gsoPath(ingress)...)

	p = append(p, sym("other", count(ctrOther))...)
	p = append(p,
		asm.Mov.Imm(asm.R0, actUnspec).WithSymbol("exit"),
		asm.Return(),
	)
	return p
}

// congestion emits the congestion point (label "cong", continuing at
// "release", or at "drop" for a tail drop): a phantom queue drained at the
// configured rate, kept as the queue-clock time at which it would be empty
// (stQTail). Its depth at a packet's arrival is (tail − now) converted to
// bytes. A packet that would take the depth above the limit is dropped;
// otherwise its IP length is added to the tail with one atomic add, and it
// is chosen for CE (fpCong = 1, applied at "ce") with probability 0 up to
// Kmin, rising linearly to Pmax at Kmax, and 1 from Kmax on.
//
// Concurrency: a packet on another CPU between our read of the tail and our
// add sees the queue without us, so the limit can be overshot by one packet
// per concurrent CPU; moving an idle queue's tail up to now is a single
// compare-and-exchange (the loser's packet is still added on top of the
// winner's now); the maximum depth is a plain store (a concurrent larger
// value can be overwritten). These errors are a packet or so; the drain
// itself is exact.
func congestion() asm.Instructions {
	p := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word).WithSymbol("cong"),
		asm.And.Imm(asm.R2, flagCong),
		asm.JEq.Imm(asm.R2, 0, "release"),
		// R7 = now on the queue clock.
		asm.FnKtimeGetNs.Call(),
		asm.LoadMem(asm.R2, asm.R8, cfgQBase, asm.DWord),
		asm.JGE.Reg(asm.R0, asm.R2, "qnow"),
		asm.Mov.Reg(asm.R0, asm.R2),
		asm.Sub.Reg(asm.R0, asm.R2).WithSymbol("qnow"),
		asm.LSh.Imm(asm.R0, qTimeShift),
		asm.Mov.Reg(asm.R7, asm.R0),
		// The packet's IP length.
		asm.LoadMem(asm.R2, asm.R6, skbLen, asm.Word),
		asm.Sub.Imm(asm.R2, 14),
		asm.StoreMem(asm.RFP, fpQLen, asm.R2, asm.DWord),
		// An idle queue's tail is moved up to now.
		asm.LoadMem(asm.R3, asm.R9, stQTail, asm.DWord),
		asm.JGE.Reg(asm.R3, asm.R7, "qbusy"),
		asm.Mov.Reg(asm.R0, asm.R3),
		asm.Mov.Reg(asm.R1, asm.R7),
		cmpXchg(asm.R9, asm.R1, stQTail),
		asm.Mov.Reg(asm.R3, asm.R7),
		// Depth in bytes = (tail − now) >> shift ns × bytes per ns.
		asm.Sub.Reg(asm.R3, asm.R7).WithSymbol("qbusy"),
		asm.RSh.Imm(asm.R3, qTimeShift),
		asm.LoadMem(asm.R2, asm.R8, cfgQBytesPerNs, asm.DWord),
		asm.Mul.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 32),
		asm.StoreMem(asm.RFP, fpQDepth, asm.R3, asm.DWord),
		// Tail drop.
		asm.LoadMem(asm.R2, asm.RFP, fpQLen, asm.DWord),
		asm.Add.Reg(asm.R2, asm.R3),
		asm.LoadMem(asm.R4, asm.R8, cfgQLimit, asm.Word),
		asm.JGT.Reg(asm.R2, asm.R4, "qdrop"),
		// Enqueue: tail += length × ns per byte.
		asm.LoadMem(asm.R4, asm.R9, stQMax, asm.DWord),
		asm.JLE.Reg(asm.R2, asm.R4, "qenq"),
		asm.StoreMem(asm.R9, stQMax, asm.R2, asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, fpQLen, asm.DWord).WithSymbol("qenq"),
		asm.LoadMem(asm.R4, asm.R8, cfgQNsPerByte, asm.DWord),
		asm.Mul.Reg(asm.R2, asm.R4),
		atomicAdd(asm.R9, asm.R2, stQTail),
	}
	p = append(p, count(ctrCongPassed)...)
	p = append(p,
		// Marking on the depth at arrival.
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagCongMark),
		asm.JEq.Imm(asm.R2, 0, "release"),
		asm.LoadMem(asm.R3, asm.RFP, fpQDepth, asm.DWord),
		asm.LoadMem(asm.R2, asm.R8, cfgQKmax, asm.Word),
		asm.JGE.Reg(asm.R3, asm.R2, "qmark"),
		asm.LoadMem(asm.R2, asm.R8, cfgQKmin, asm.Word),
		asm.JLE.Reg(asm.R3, asm.R2, "release"),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.R8, cfgQSlope, asm.DWord),
		asm.Mul.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 16),
		asm.Mov.Reg(asm.R7, asm.R3),
		asm.FnGetPrandomU32.Call(),
		asm.JGE.Reg(asm.R0, asm.R7, "release"),
	)
	p = append(p, sym("qmark", store64(asm.RFP, fpCong, 1))...)
	p = append(p, asm.Ja.Label("release"))
	p = append(p, sym("qdrop", count(ctrCongDropped))...)
	p = append(p, asm.Ja.Label("drop"))
	return p
}

// ceMark emits the CE marking of the packet in fpIP (entry label
// pfx+"cemark"; fpFamily and fpCong set), continuing at next on every
// outcome: marked (IPv4 TOS with the header checksum fixed, or IPv6
// traffic class), already CE, not ECN-capable without flagCEAll, or a
// helper error. cnt emits a counter increment — by one for a packet, by
// the segment count for a GSO datagram; marked is appended where a mark
// was made.
func ceMark(pfx, next string, cnt func(int) asm.Instructions, marked asm.Instructions) asm.Instructions {
	p := asm.Instructions{
		asm.LoadMem(asm.R2, asm.RFP, fpFamily, asm.DWord).WithSymbol(pfx + "cemark"),
		asm.JEq.Imm(asm.R2, 6, pfx+"ce6"),
		// IPv4: TOS is byte 1; the checksum covers the 16-bit word 0.
		asm.LoadMem(asm.R3, asm.RFP, fpIP+1, asm.Byte),
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.And.Imm(asm.R4, 3),
		asm.JEq.Imm(asm.R4, 3, next),
		asm.JNE.Imm(asm.R4, 0, pfx+"ce4mark"),
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagCEAll),
		asm.JEq.Imm(asm.R2, 0, pfx+"notect"),
		asm.LoadMem(asm.R2, asm.RFP, fpIP, asm.Half).WithSymbol(pfx + "ce4mark"),
		asm.StoreMem(asm.RFP, fpSavedMark, asm.R2, asm.DWord),
		asm.Or.Imm(asm.R3, 3),
		asm.StoreMem(asm.RFP, fpIP+1, asm.R3, asm.Byte),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 15),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpIP+1),
		asm.Mov.Imm(asm.R4, 1),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, pfx+"ceerr"),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 14+10),
		asm.LoadMem(asm.R3, asm.RFP, fpSavedMark, asm.DWord),
		asm.LoadMem(asm.R4, asm.RFP, fpIP, asm.Half),
		asm.Mov.Imm(asm.R5, 2),
		asm.FnL3CsumReplace.Call(),
		asm.JNE.Imm(asm.R0, 0, pfx+"ceerr"),
		asm.Ja.Label(pfx + "cedone"),
		// IPv6: traffic class bits 3:0 sit in the high nibble of byte 1;
		// ECN is bits 1:0 of the traffic class = 0x30 of byte 1.
		asm.LoadMem(asm.R3, asm.RFP, fpIP+1, asm.Byte).WithSymbol(pfx + "ce6"),
		asm.Mov.Reg(asm.R4, asm.R3),
		asm.And.Imm(asm.R4, 0x30),
		asm.JEq.Imm(asm.R4, 0x30, next),
		asm.JNE.Imm(asm.R4, 0, pfx+"ce6mark"),
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagCEAll),
		asm.JEq.Imm(asm.R2, 0, pfx+"notect"),
		asm.Or.Imm(asm.R3, 0x30).WithSymbol(pfx + "ce6mark"),
		asm.StoreMem(asm.RFP, fpIP+1, asm.R3, asm.Byte),
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.Mov.Imm(asm.R2, 15),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpIP+1),
		asm.Mov.Imm(asm.R4, 1),
		asm.Mov.Imm(asm.R5, 0),
		asm.FnSkbStoreBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, pfx+"ceerr"),
	}
	p = append(p, sym(pfx+"cedone", cnt(ctrCEMarked))...)
	p = append(p, marked...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpCong, asm.DWord),
		asm.JEq.Imm(asm.R2, 0, next),
	)
	p = append(p, cnt(ctrCongMarked)...)
	p = append(p, asm.Ja.Label(next))
	p = append(p, sym(pfx+"notect", cnt(ctrCENotECT))...)
	p = append(p, asm.Ja.Label(next))
	p = append(p, sym(pfx+"ceerr", count(ctrErrors))...)
	p = append(p, asm.Ja.Label(next))
	return p
}

// atomicAdd emits an atomic 64-bit add without fetch: *(dst+off) += src.
func atomicAdd(dst, src asm.Register, off int16) asm.Instruction {
	ins := asm.AddAtomic.Mem(dst, src, asm.DWord, off)
	ins.Constant = int64(asm.AddAtomic >> 8)
	return ins
}

// sym labels the first instruction of ins.
func sym(name string, ins asm.Instructions) asm.Instructions {
	ins[0] = ins[0].WithSymbol(name)
	return ins
}

// ne is the host byte order of map values.
var ne = binary.NativeEndian

// store64 emits *(u64 *)(dst+off) = v through R1 (cilium/ebpf v0.22.0
// cannot encode a 64-bit store of an immediate).
func store64(dst asm.Register, off int16, v int32) asm.Instructions {
	return asm.Instructions{asm.Mov.Imm(asm.R1, v), asm.StoreMem(dst, off, asm.R1, asm.DWord)}
}

// shot emits the drop of the packet. On ingress it is TC_ACT_SHOT. On
// egress a plain drop is NET_XMIT_DROP, which a UDP socket with IP_RECVERR
// (rocev2's SocketLink has it) returns to the sender as ENOBUFS: the link
// then counts the packet as not sent and sends it again, so the drop would
// be neither a loss nor counted right. A packet lost in the network leaves
// the sender with success; so the packet is marked dropMark and redirected
// to the interface's own egress (bpf_redirect: TC_ACT_REDIRECT, which the
// sender sees as success), and the program drops it on that second pass.
func shot(ingress bool) asm.Instructions {
	if ingress {
		return asm.Instructions{asm.Mov.Imm(asm.R0, actShot), asm.Return()}
	}
	return asm.Instructions{
		asm.Mov.Imm(asm.R2, dropMark),
		asm.StoreMem(asm.R6, skbMark, asm.R2, asm.Word),
		asm.LoadMem(asm.R1, asm.R6, skbIfindex, asm.Word),
		asm.Mov.Imm(asm.R2, 0),
		asm.FnRedirect.Call(),
		asm.Return(),
	}
}
