//go:build linux

package faults

import (
	"fmt"

	"github.com/cilium/ebpf/asm"
)

// gsoMaxSegs is the most segments of one GSO datagram the program looks
// into: Linux's UDP_MAX_SEGMENTS (64 before 6.11, 128 since). A datagram
// with more (a GRO train on an ingress hook could be one) passes whole and
// counts in Counters.GSOSkipped.
const gsoMaxSegs = 128

// Stack slots of the GSO path (below the per-packet path's, see prog.go).
const (
	fpGN      = -136 // u64: segments in the datagram (gso_segs)
	fpGSize   = -144 // u64: UDP payload bytes per segment (gso_size)
	fpGOff    = -152 // u64: offset of the next segment's BTH
	fpGSel    = -160 // u64: segments selected (DestQP filter passed)
	fpGPSN    = -168 // u64: selected segments in the PSN range
	fpGReq    = -176 // u64: request segments (the DropRequests kind)
	fpGRnd    = -184 // u64: selected segments that drew a random drop
	fpGCE     = -192 // u64: selected segments that drew CE
	fpGDup    = -200 // u64: selected segments that drew a duplicate
	fpGBTH    = -216 // 12 bytes: the BTH of the segment being read
	fpGSegLen = -224 // u64: IP length of a full segment
	fpGTotal  = -232 // u64: IP bytes of all segments
)

// countN emits counter[idx] += the datagram's segment count (fpGN) on the
// state value in R9 (clobbers R1).
func countN(idx int) asm.Instructions {
	return countSlot(idx, fpGN)
}

// countSlot emits counter[idx] += the u64 at fp+slot (clobbers R1).
func countSlot(idx int, slot int16) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.RFP, slot, asm.DWord),
		atomicAdd(asm.R9, asm.R1, int16(stCounters+8*idx)),
	}
}

// inc emits (*u64)(fp+slot)++ (clobbers R1).
func inc(slot int16) asm.Instructions {
	return asm.Instructions{
		asm.LoadMem(asm.R1, asm.RFP, slot, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.RFP, slot, asm.R1, asm.DWord),
	}
}

// gsoPath emits the treatment of a UDP GSO datagram (entry label "gso"):
// one skb that leaves as gso_segs RoCE packets, segment k carrying UDP
// payload bytes [k·gso_size, (k+1)·gso_size) — its own BTH at the start,
// its own ICRC at the end — behind a copy of the IP and UDP headers. The
// semantics (Config's doc has them for users):
//
//   - every segment is read (its BTH) and counted: Seen, GSOSegs and the
//     per-rule counters count segments; GSO counts datagrams;
//   - the DestQP filter, the PSN range, the every-Nth sequence and the
//     random draws (drop, CE, duplicate) apply per segment, exactly as to
//     a packet of its own;
//   - what one segment draws hits the whole datagram (an skb is dropped,
//     marked or cloned whole) and is counted for all its segments: a
//     datagram of n segments with one segment in the PSN range is dropped
//     and DropPSN grows by n;
//   - the congestion point takes the datagram as its segments arriving back
//     to back: tail drop when the last one would pass the limit (nothing
//     of it enqueued), otherwise segment k finds the depth at arrival plus
//     k full segments and draws its CE mark on that;
//   - GSO datagrams are never held for reordering (the slot holds one
//     frame of at most holdMax bytes); a held packet is released behind the
//     next packet or GSO datagram through the hook.
//
// The segment loop is unrolled gsoMaxSegs times (no verifier loop
// analysis); its tallies start from a map value (cfgZero) so the verifier
// tracks them as unknown numbers, and every copy joins the next one's
// state. Registers: R6 skb, R7 UDP header offset, R8 config, R9 state.
func gsoPath(ingress bool) asm.Instructions {
	p := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R6, skbGSOSegs, asm.Word).WithSymbol("gso"),
		asm.StoreMem(asm.RFP, fpGN, asm.R2, asm.DWord),
		asm.LoadMem(asm.R3, asm.R6, skbGSOSize, asm.Word),
		asm.StoreMem(asm.RFP, fpGSize, asm.R3, asm.DWord),
	}
	p = append(p, count(ctrGSO)...)
	p = append(p, countN(ctrGSOSegs)...)
	p = append(p,
		// Geometry: a segment holds at least a BTH and an ICRC (16 bytes),
		// and the UDP payload fills n-1 segments and 16 bytes or more of
		// the last.
		asm.LoadMem(asm.R3, asm.RFP, fpGSize, asm.DWord),
		asm.JLT.Imm(asm.R3, 16, "g_skip"),
		asm.LoadMem(asm.R4, asm.R6, skbLen, asm.Word),
		asm.Sub.Reg(asm.R4, asm.R7),
		asm.Sub.Imm(asm.R4, 8), // UDP payload bytes (the BTH was read: no underflow)
		asm.LoadMem(asm.R2, asm.RFP, fpGN, asm.DWord),
		asm.Mov.Reg(asm.R5, asm.R2),
		asm.Mul.Reg(asm.R5, asm.R3),
		asm.JGT.Reg(asm.R4, asm.R5, "g_skip"),
		asm.Sub.Reg(asm.R5, asm.R3),
		asm.Add.Imm(asm.R5, 15),
		asm.JLE.Reg(asm.R4, asm.R5, "g_skip"), // the last segment holds 16 bytes or more
		// IP length of a full segment: IP header + UDP header + gso_size;
		// of the datagram: n·(IP + UDP header) + payload.
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Sub.Imm(asm.R1, 14-8),
		asm.Mov.Reg(asm.R0, asm.R1),
		asm.Add.Reg(asm.R0, asm.R3),
		asm.StoreMem(asm.RFP, fpGSegLen, asm.R0, asm.DWord),
		asm.Mul.Reg(asm.R1, asm.R2),
		asm.Add.Reg(asm.R1, asm.R4),
		asm.StoreMem(asm.RFP, fpGTotal, asm.R1, asm.DWord),
		// Tallies from zero; the first BTH follows the UDP header.
		asm.LoadMem(asm.R1, asm.R8, cfgZero, asm.DWord),
		asm.StoreMem(asm.RFP, fpGSel, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, fpGPSN, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, fpGReq, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, fpGRnd, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, fpGCE, asm.R1, asm.DWord),
		asm.StoreMem(asm.RFP, fpGDup, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R1, asm.R7),
		asm.Add.Imm(asm.R1, 8),
		asm.StoreMem(asm.RFP, fpGOff, asm.R1, asm.DWord),
	)
	for k := range gsoMaxSegs {
		p = append(p, gsoSegment(k)...)
	}
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpGN, asm.DWord),
		asm.JGT.Imm(asm.R2, gsoMaxSegs, "g_skip"),
	)

	// Every segment read: count, then decide for the datagram. The
	// segment count is read again from the skb: each loop exit knows it as
	// a different constant, and with the reload the verifier sees one
	// state here instead of one per exit (the code below would otherwise
	// be verified gsoMaxSegs times).
	p = append(p,
		asm.LoadMem(asm.R2, asm.R6, skbGSOSegs, asm.Word).WithSymbol("g_scanned"),
		asm.StoreMem(asm.RFP, fpGN, asm.R2, asm.DWord),
	)
	p = append(p, countN(ctrSeen)...)
	p = append(p,
		asm.LoadMem(asm.R1, asm.RFP, fpGN, asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, fpGSel, asm.DWord),
		asm.Sub.Reg(asm.R1, asm.R2),
		atomicAdd(asm.R9, asm.R1, int16(stCounters+8*ctrFiltered)),
		asm.JEq.Imm(asm.R2, 0, "exit"),
		asm.Mov.Imm(asm.R1, 0),
		asm.StoreMem(asm.RFP, fpCong, asm.R1, asm.DWord),

		// PSN range: each selected segment in it spends one unit of the
		// budget; the datagram is dropped while budget was left.
		asm.LoadMem(asm.R3, asm.RFP, fpGPSN, asm.DWord),
		asm.JEq.Imm(asm.R3, 0, "g_nth"),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNLimit, asm.Word),
		asm.JEq.Imm(asm.R2, 0, "g_psndrop"),
		fetchAdd(asm.R9, asm.R3, stPSNDrops),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNLimit, asm.Word),
		asm.JGE.Reg(asm.R3, asm.R2, "g_nth"),
	)
	p = append(p, sym("g_psndrop", countN(ctrDropPSN))...)
	p = append(p, asm.Ja.Label("g_drop"))

	// Every Nth: the sequence advances by the selected segments; drop
	// when a multiple of N falls among them.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgEveryN, asm.Word).WithSymbol("g_nth"),
		asm.JEq.Imm(asm.R2, 0, "g_rnd"),
		asm.LoadMem(asm.R3, asm.RFP, fpGSel, asm.DWord),
		fetchAdd(asm.R9, asm.R3, stSeq),
		asm.LoadMem(asm.R4, asm.RFP, fpGSel, asm.DWord),
		asm.Add.Reg(asm.R4, asm.R3),
		asm.LoadMem(asm.R2, asm.R8, cfgEveryN, asm.Word),
		asm.Div.Reg(asm.R3, asm.R2),
		asm.Div.Reg(asm.R4, asm.R2),
		asm.JEq.Reg(asm.R3, asm.R4, "g_rnd"),
	)
	p = append(p, countN(ctrDropNth)...)
	p = append(p, asm.Ja.Label("g_drop"))

	// Random drop: some selected segment drew it.
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpGRnd, asm.DWord).WithSymbol("g_rnd"),
		asm.JEq.Imm(asm.R2, 0, "g_cong"),
	)
	p = append(p, countN(ctrDropRandom)...)
	p = append(p, asm.Ja.Label("g_drop"))

	p = append(p, gsoCongestion()...)

	// CE: the congestion point chose it, or a selected segment drew it.
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpCong, asm.DWord).WithSymbol("g_ce"),
		asm.JNE.Imm(asm.R2, 0, "g_cemark"),
		asm.LoadMem(asm.R2, asm.RFP, fpGCE, asm.DWord),
		asm.JEq.Imm(asm.R2, 0, "g_dup"),
	)
	p = append(p, ceMark("g_", "g_dup", countN, count(ctrGSOMarked))...)

	// Duplicate the whole datagram (the clone is a GSO skb too).
	p = append(p,
		asm.LoadMem(asm.R2, asm.RFP, fpGDup, asm.DWord).WithSymbol("g_dup"),
		asm.JEq.Imm(asm.R2, 0, "g_release"),
	)
	p = append(p, cloneOut(ingress)...)
	p = append(p, asm.JEq.Imm(asm.R0, 0, "g_dupok"))
	p = append(p, count(ctrErrors)...)
	p = append(p, asm.Ja.Label("g_release"))
	p = append(p, sym("g_dupok", countN(ctrDuplicated))...)

	// A held packet (ReorderRate) leaves behind the datagram: the datagram
	// is cloned out first (marked or not, after its duplicate), then the
	// skb becomes the held frame (the packet path's "morph": changing the
	// skb's length also ends its GSO state).
	p = append(p,
		asm.LoadMem(asm.R2, asm.R9, stHoldState, asm.DWord).WithSymbol("g_release"),
		asm.JNE.Imm(asm.R2, 2, "exit"),
		asm.Mov.Imm(asm.R0, 2),
		asm.Mov.Imm(asm.R3, 3),
		cmpXchg(asm.R9, asm.R3, stHoldState),
		asm.JNE.Imm(asm.R0, 2, "exit"),
	)
	p = append(p, cloneOut(ingress)...)
	p = append(p, asm.JEq.Imm(asm.R0, 0, "morph"))
	p = append(p, count(ctrErrors)...)
	p = append(p, asm.Ja.Label("morph"))

	// Drop the datagram: all its segments are lost.
	p = append(p, sym("g_drop", countSlot(ctrDropRequests, fpGReq))...)
	p = append(p, count(ctrGSODropped)...)
	p = append(p, asm.Ja.Label("shot"))

	// A segment could not be read, or the geometry is not one of UDP GSO:
	// pass it whole, counted.
	p = append(p, sym("g_err", count(ctrErrors))...)
	p = append(p, sym("g_skip", count(ctrGSOSkipped))...)
	p = append(p, asm.Ja.Label("exit"))
	return p
}

// gsoSegment emits copy k of the segment loop: stop at the datagram's end
// (k ≥ n; copies 0 and 1 always run, a GSO datagram has two segments or
// more), read segment k's BTH and tally it.
func gsoSegment(k int) asm.Instructions {
	l := func(s string) string { return fmt.Sprintf("g%d_%s", k, s) }
	var p asm.Instructions
	if k >= 2 {
		p = append(p,
			asm.LoadMem(asm.R2, asm.RFP, fpGN, asm.DWord),
			asm.JLE.Imm(asm.R2, int32(k), "g_scanned"),
		)
	}
	p = append(p,
		asm.Mov.Reg(asm.R1, asm.R6),
		asm.LoadMem(asm.R2, asm.RFP, fpGOff, asm.DWord),
		asm.Mov.Reg(asm.R3, asm.RFP),
		asm.Add.Imm(asm.R3, fpGBTH),
		asm.Mov.Imm(asm.R4, 12),
		asm.FnSkbLoadBytes.Call(),
		asm.JNE.Imm(asm.R0, 0, "g_err"),
		asm.LoadMem(asm.R2, asm.RFP, fpGOff, asm.DWord),
		asm.LoadMem(asm.R3, asm.RFP, fpGSize, asm.DWord),
		asm.Add.Reg(asm.R2, asm.R3),
		asm.StoreMem(asm.RFP, fpGOff, asm.R2, asm.DWord),
		// A request segment (not READ response/ACK/atomic ACK, not CNP)?
		asm.LoadMem(asm.R2, asm.RFP, fpGBTH, asm.Byte),
		asm.Mov.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xe0),
		asm.JEq.Imm(asm.R3, 0x80, l("qp")),
		asm.And.Imm(asm.R2, 0x1f),
		asm.JLT.Imm(asm.R2, 0x0d, l("req")),
		asm.JLE.Imm(asm.R2, 0x12, l("qp")),
	)
	p = append(p, sym(l("req"), inc(fpGReq))...)
	// DestQP filter.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word).WithSymbol(l("qp")),
		asm.And.Imm(asm.R2, flagDestQP),
		asm.JEq.Imm(asm.R2, 0, l("sel")),
		asm.LoadMem(asm.R3, asm.RFP, fpGBTH+5, asm.Byte),
		asm.LSh.Imm(asm.R3, 16),
		asm.LoadMem(asm.R2, asm.RFP, fpGBTH+6, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.RFP, fpGBTH+7, asm.Byte),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.R8, cfgDestQP, asm.Word),
		asm.JNE.Reg(asm.R3, asm.R2, l("next")),
	)
	p = append(p, sym(l("sel"), inc(fpGSel))...)
	// PSN range.
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagPSN),
		asm.JEq.Imm(asm.R2, 0, l("rnd")),
		asm.LoadMem(asm.R3, asm.RFP, fpGBTH+9, asm.Byte),
		asm.LSh.Imm(asm.R3, 16),
		asm.LoadMem(asm.R2, asm.RFP, fpGBTH+10, asm.Byte),
		asm.LSh.Imm(asm.R2, 8),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.RFP, fpGBTH+11, asm.Byte),
		asm.Or.Reg(asm.R3, asm.R2),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNFirst, asm.Word),
		asm.Sub.Reg(asm.R3, asm.R2),
		asm.And.Imm(asm.R3, 0xffffff),
		asm.LoadMem(asm.R2, asm.R8, cfgPSNSpan, asm.Word),
		asm.JGT.Reg(asm.R3, asm.R2, l("rnd")),
	)
	p = append(p, inc(fpGPSN)...)
	// The random draws of this segment.
	p = append(p, sym(l("rnd"), random(cfgDropThr, l("ce")))...)
	p = append(p, inc(fpGRnd)...)
	p = append(p, sym(l("ce"), random(cfgCEThr, l("dup")))...)
	p = append(p, inc(fpGCE)...)
	p = append(p, sym(l("dup"), random(cfgDupThr, l("next")))...)
	p = append(p, inc(fpGDup)...)
	// The next copy starts here; its first instruction carries the label.
	p = append(p, asm.Mov.Imm(asm.R0, 0).WithSymbol(l("next")))
	return p
}

// gsoCongestion emits the congestion point for a GSO datagram (label
// "g_cong", continuing at "g_ce", or at "g_drop" for a tail drop): the
// same phantom queue as congestion(), the datagram's segments arriving
// back to back. Tail drop when depth + all its IP bytes would pass the
// limit; otherwise all are enqueued with one atomic add, and segment k
// draws its CE mark on depth + k full segments (the ramp of congestion());
// the first segment chosen marks the datagram.
func gsoCongestion() asm.Instructions {
	p := asm.Instructions{
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word).WithSymbol("g_cong"),
		asm.And.Imm(asm.R2, flagCong),
		asm.JEq.Imm(asm.R2, 0, "g_ce"),
		asm.FnKtimeGetNs.Call(),
		asm.LoadMem(asm.R2, asm.R8, cfgQBase, asm.DWord),
		asm.JGE.Reg(asm.R0, asm.R2, "g_qnow"),
		asm.Mov.Reg(asm.R0, asm.R2),
		asm.Sub.Reg(asm.R0, asm.R2).WithSymbol("g_qnow"),
		asm.LSh.Imm(asm.R0, qTimeShift),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.LoadMem(asm.R3, asm.R9, stQTail, asm.DWord),
		asm.JGE.Reg(asm.R3, asm.R7, "g_qbusy"),
		asm.Mov.Reg(asm.R0, asm.R3),
		asm.Mov.Reg(asm.R1, asm.R7),
		cmpXchg(asm.R9, asm.R1, stQTail),
		asm.Mov.Reg(asm.R3, asm.R7),
		asm.Sub.Reg(asm.R3, asm.R7).WithSymbol("g_qbusy"),
		asm.RSh.Imm(asm.R3, qTimeShift),
		asm.LoadMem(asm.R2, asm.R8, cfgQBytesPerNs, asm.DWord),
		asm.Mul.Reg(asm.R3, asm.R2),
		asm.RSh.Imm(asm.R3, 32),
		asm.StoreMem(asm.RFP, fpQDepth, asm.R3, asm.DWord),
		// Tail drop of the whole datagram.
		asm.LoadMem(asm.R2, asm.RFP, fpGTotal, asm.DWord),
		asm.Add.Reg(asm.R2, asm.R3),
		asm.LoadMem(asm.R4, asm.R8, cfgQLimit, asm.Word),
		asm.JGT.Reg(asm.R2, asm.R4, "g_qdrop"),
		asm.LoadMem(asm.R4, asm.R9, stQMax, asm.DWord),
		asm.JLE.Reg(asm.R2, asm.R4, "g_qenq"),
		asm.StoreMem(asm.R9, stQMax, asm.R2, asm.DWord),
		asm.LoadMem(asm.R2, asm.RFP, fpGTotal, asm.DWord).WithSymbol("g_qenq"),
		asm.LoadMem(asm.R4, asm.R8, cfgQNsPerByte, asm.DWord),
		asm.Mul.Reg(asm.R2, asm.R4),
		atomicAdd(asm.R9, asm.R2, stQTail),
	}
	p = append(p, countN(ctrCongPassed)...)
	p = append(p,
		asm.LoadMem(asm.R2, asm.R8, cfgFlags, asm.Word),
		asm.And.Imm(asm.R2, flagCongMark),
		asm.JEq.Imm(asm.R2, 0, "g_ce"),
	)
	for k := range gsoMaxSegs {
		l := func(s string) string { return fmt.Sprintf("g%d_q%s", k, s) }
		if k >= 1 {
			p = append(p,
				asm.LoadMem(asm.R2, asm.RFP, fpGN, asm.DWord),
				asm.JLE.Imm(asm.R2, int32(k), "g_ce"),
				// Segment k arrives behind k full segments.
				asm.LoadMem(asm.R3, asm.RFP, fpQDepth, asm.DWord),
				asm.LoadMem(asm.R2, asm.RFP, fpGSegLen, asm.DWord),
				asm.Add.Reg(asm.R3, asm.R2),
				asm.StoreMem(asm.RFP, fpQDepth, asm.R3, asm.DWord),
			)
		}
		p = append(p,
			asm.LoadMem(asm.R3, asm.RFP, fpQDepth, asm.DWord),
			asm.LoadMem(asm.R2, asm.R8, cfgQKmax, asm.Word),
			asm.JGE.Reg(asm.R3, asm.R2, "g_qmark"),
			asm.LoadMem(asm.R2, asm.R8, cfgQKmin, asm.Word),
			asm.JLE.Reg(asm.R3, asm.R2, l("next")),
			asm.Sub.Reg(asm.R3, asm.R2),
			asm.LoadMem(asm.R2, asm.R8, cfgQSlope, asm.DWord),
			asm.Mul.Reg(asm.R3, asm.R2),
			asm.RSh.Imm(asm.R3, 16),
			asm.Mov.Reg(asm.R7, asm.R3),
			asm.FnGetPrandomU32.Call(),
			asm.JLT.Reg(asm.R0, asm.R7, "g_qmark"),
			asm.Mov.Imm(asm.R0, 0).WithSymbol(l("next")),
		)
	}
	p = append(p, asm.Ja.Label("g_ce"))
	p = append(p, sym("g_qmark", store64(asm.RFP, fpCong, 1))...)
	p = append(p, asm.Ja.Label("g_ce"))
	p = append(p, sym("g_qdrop", countN(ctrCongDropped))...)
	p = append(p, asm.Ja.Label("g_drop"))
	return p
}
