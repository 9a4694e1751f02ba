//go:build linux

package interop

import (
	"fmt"
	"regexp"
	"strconv"

	"github.com/gorocev2/rocev2/bth"
)

// ppCheckPage is the page size of ibv_rc_pingpong -c's marks (the VM's and
// rocev2d's: 4096).
const ppCheckPage = 4096

// pingpongData checks a SEND of ibv_rc_pingpong -c / rocev2d pingpong -c:
// the client sets the first byte of every page of its buffer (0x7b
// everywhere) to 0 and the message bounces back and forth unchanged, so
// every SEND in both directions carries that buffer. Without -c on the
// client the first byte would be 0x7b.
func pingpongData(p Payload) string {
	if p.MsgOff < 0 {
		return "the message's first packet is not in the capture"
	}
	for k, v := range p.Data {
		off := p.MsgOff + k
		want := byte(0x7b)
		if off%ppCheckPage == 0 {
			want = 0
		}
		if v != want {
			return fmt.Sprintf("message byte %d is %#02x, want %#02x", off, v, want)
		}
	}
	return ""
}

// perfPattern is the byte at offset off of rocev2d's --check source
// region (cmd/internal/perftest/perf.go).
func perfPattern(off int) byte { return byte(off*131 + off>>8 + 7) }

// patternAt checks that b, starting at offset off of a --check region,
// holds the pattern.
func patternAt(b []byte, off int) string {
	for k, v := range b {
		if want := perfPattern(off + k); v != want {
			return fmt.Sprintf("byte at region offset %d is %#02x, want the --check pattern %#02x", off+k, v, want)
		}
	}
	return ""
}

var reVAddr = regexp.MustCompile(`(?m)^ (local|remote) address:.* VAddr (0x[0-9a-fA-F]+)`)

// perfVAddr returns the VAddr of rocev2d's "local" or "remote" address
// line.
func perfVAddr(out, side string) (uint64, error) {
	for _, m := range reVAddr.FindAllStringSubmatch(out, -1) {
		if m[1] == side {
			return strconv.ParseUint(m[2], 0, 64)
		}
	}
	return 0, fmt.Errorf("no %s address line with a VAddr in rocev2d's output", side)
}

// atomicData checks atomic ACKs against a model of the target memory: each
// original value must be what the previous operation on that address left
// (FETCH_ADD: orig+add; COMPARE_SWAP: swap when orig == compare). With
// zeroStart the memory starts at 0 (rocev2d --check zeroes its target);
// otherwise an address's first result sets the model. Resent ACKs (replies
// to a duplicate request, replayed from the responder's saved result) are
// skipped.
func atomicData(zeroStart bool) DataCheck {
	mem := map[uint64]uint64{}
	return func(p Payload) string {
		a := p.Atomic
		if a == nil || p.Resent {
			return ""
		}
		cur, known := mem[a.VA]
		if !known && zeroStart {
			cur, known = 0, true
		}
		if known && a.Orig != cur {
			return fmt.Sprintf("%s at VA %#x returned %d, want %d (the value the previous operation left)", a.Op, a.VA, a.Orig, cur)
		}
		next := a.Orig + a.SwapAdd
		if a.Op == bth.RCCompareSwap {
			next = a.Orig
			if a.Orig == a.Compare {
				next = a.SwapAdd
			}
		}
		mem[a.VA] = next
		return ""
	}
}

// perfDataCheck returns the wire data check of a perftest cell (rocev2d
// subcommand sub in the given role), what it checks, and whether rocev2d
// runs with --check. --check fills rocev2d's source with a pattern and
// verifies its own target at the end; against a real perftest peer it is
// meaningful only where rocev2d's side is the source or its target is
// written predictably:
//   - atomic-bw, rocev2d server: rocev2d zeroes its target and verifies
//     the per-slot totals; the capture is checked against a zero-based
//     memory model. As client, the capture's results must still follow
//     the (unknown-start) memory model, but rxe's target is perftest's.
//   - read-bw / read-lat, rocev2d server: rocev2d serves the pattern; every
//     READ response must carry it at its VA. As client it would check what
//     perftest's server holds (not the pattern): no --check.
//   - write-bw / send-bw, rocev2d client: rocev2d sends the pattern; every
//     WRITE (at its VA) and SEND (at its message offset) must carry it. As
//     server it would check what perftest wrote: no --check.
//   - write-lat: rocev2d stores an iteration count in the last byte of
//     every message, so the wire data is not the pattern: no --check.
func perfDataCheck(sub string, server bool) (func(hostOut string) (DataCheck, error), string, bool) {
	fromHost := func(f func(p Payload) string) DataCheck {
		return func(p Payload) string {
			if !p.FromHost {
				return ""
			}
			return f(p)
		}
	}
	switch {
	case sub == "atomic-bw" && server:
		return func(string) (DataCheck, error) { return atomicData(true), nil },
			"every atomic result follows rocev2d's target from 0", true
	case sub == "atomic-bw":
		return func(string) (DataCheck, error) { return atomicData(false), nil },
			"every atomic result follows rxe's target from its first value", false
	case (sub == "read-bw" || sub == "read-lat") && server:
		return func(out string) (DataCheck, error) {
			base, err := perfVAddr(out, "local")
			if err != nil {
				return nil, err
			}
			return fromHost(func(p Payload) string {
				if !p.HasVA {
					return "READ response without a matching READ request"
				}
				return patternAt(p.Data, int(p.VA-base))
			}), nil
		}, "every READ response from rocev2d carries the --check pattern at its VA", true
	case sub == "write-bw" && !server:
		return func(out string) (DataCheck, error) {
			base, err := perfVAddr(out, "remote")
			if err != nil {
				return nil, err
			}
			return fromHost(func(p Payload) string {
				if !p.HasVA {
					return "WRITE without a VA"
				}
				return patternAt(p.Data, int(p.VA-base))
			}), nil
		}, "every WRITE from rocev2d carries the --check pattern at its VA", true
	case sub == "send-bw" && !server:
		return func(string) (DataCheck, error) {
			return fromHost(func(p Payload) string {
				if p.MsgOff < 0 {
					return "the message's first packet is not in the capture"
				}
				return patternAt(p.Data, p.MsgOff)
			}), nil
		}, "every SEND from rocev2d carries the --check pattern", true
	}
	return nil, "", false
}

// udQKey is ibv_ud_pingpong's Q_Key (and rocev2d ud-pingpong's).
const udQKey = 0x11111111

// reUDAddr matches the address lines of ibv_ud_pingpong and rocev2d
// ud-pingpong ("PSN 0x...: GID" on the local line, ", GID" on the remote).
var reUDAddr = regexp.MustCompile(`(?m)^  (local|remote) address: +LID 0x[0-9a-f]{4}, QPN (0x[0-9a-f]{6}), PSN (0x[0-9a-f]{6})[:,] GID `)

// ppSide is the QPN and first PSN of one side's address line.
type ppSide struct{ qpn, psn uint32 }

// ppAddrs returns the QPNs and first PSNs of rocev2d's local and remote
// address lines (any of the ping-pongs: reUDAddr takes both formats).
func ppAddrs(hostOut string) (loc, rem ppSide, err error) {
	var found int
	for _, m := range reUDAddr.FindAllStringSubmatch(hostOut, -1) {
		q, _ := strconv.ParseUint(m[2], 0, 32)
		p, _ := strconv.ParseUint(m[3], 0, 32)
		if m[1] == "local" {
			loc, found = ppSide{uint32(q), uint32(p)}, found|1
		} else {
			rem, found = ppSide{uint32(q), uint32(p)}, found|2
		}
	}
	if found != 3 {
		return loc, rem, fmt.Errorf("rocev2d printed no local and remote address lines")
	}
	return loc, rem, nil
}

// udPingpongData returns the wire check of a ud-pingpong cell from
// rocev2d's output (its own and the tool's QPN and first PSN): every
// packet is a UD datagram with ibv_ud_pingpong's Q_Key 0x11111111, from
// the QP its sender announced to the one its receiver announced, PSNs
// consecutive from the announced first PSN in each direction (nothing
// lost, repeated or reordered on the tap), size bytes of the -c buffer
// (pingpongData: 0 at each page start, 0x7b elsewhere).
func udPingpongData(size int) func(hostOut string) (DataCheck, error) {
	return func(hostOut string) (DataCheck, error) {
		loc, rem, err := ppAddrs(hostOut)
		if err != nil {
			return nil, err
		}
		next := map[bool]uint32{true: loc.psn, false: rem.psn}
		return func(p Payload) string {
			if p.UD == nil {
				return fmt.Sprintf("%s is not a UD datagram", p.Opcode)
			}
			from, to := rem, loc
			if p.FromHost {
				from, to = loc, rem
			}
			wantPSN := next[p.FromHost]
			next[p.FromHost] = (p.PSN + 1) & 0xffffff
			switch {
			case p.Opcode != bth.UDSendOnly:
				return fmt.Sprintf("opcode %s, want %s", p.Opcode, bth.UDSendOnly)
			case p.UD.QKey != udQKey:
				return fmt.Sprintf("Q_Key %#x, want %#x", p.UD.QKey, udQKey)
			case p.UD.SrcQP != from.qpn || p.UD.DestQP != to.qpn:
				return fmt.Sprintf("QP %#x -> %#x, want %#x -> %#x (the address lines)", p.UD.SrcQP, p.UD.DestQP, from.qpn, to.qpn)
			case p.PSN != wantPSN:
				return fmt.Sprintf("PSN %#06x, want %#06x (first: the announced PSN, then consecutive)", p.PSN, wantPSN)
			case len(p.Data) != size:
				return fmt.Sprintf("%d bytes, want %d", len(p.Data), size)
			}
			return pingpongData(p)
		}, nil
	}
}

// ucPingpongData returns the wire check of a uc-pingpong cell from
// rocev2d's output (its own and the tool's QPN and first PSN): every
// packet is a UC SEND, to the QP its receiver announced, without AckReq
// (UC has no acknowledgements), PSNs consecutive from the announced first
// PSN in each direction (nothing lost, repeated or reordered on the tap:
// UC never resends), each message ceil(size/labMTU) packets — SEND_ONLY,
// or SEND_FIRST, MIDDLE..., LAST — of labMTU bytes but the last, and the
// data the -c buffer (pingpongData).
func ucPingpongData(size int) func(hostOut string) (DataCheck, error) {
	return func(hostOut string) (DataCheck, error) {
		loc, rem, err := ppAddrs(hostOut)
		if err != nil {
			return nil, err
		}
		per := max(1, (size+labMTU-1)/labMTU)
		// Per direction (true: from the host): the next PSN and the
		// packet's index in its message.
		next := map[bool]uint32{true: loc.psn, false: rem.psn}
		idx := map[bool]int{}
		return func(p Payload) string {
			to := loc
			if p.FromHost {
				to = rem
			}
			k := idx[p.FromHost]
			idx[p.FromHost] = (k + 1) % per
			wantPSN := next[p.FromHost]
			next[p.FromHost] = (p.PSN + 1) & 0xffffff
			wantOp := bth.UCSendMiddle
			switch {
			case per == 1:
				wantOp = bth.UCSendOnly
			case k == 0:
				wantOp = bth.UCSendFirst
			case k == per-1:
				wantOp = bth.UCSendLast
			}
			wantLen := labMTU
			if k == per-1 {
				wantLen = size - (per-1)*labMTU
			}
			switch {
			case p.Opcode != wantOp:
				return fmt.Sprintf("opcode %s, want %s (packet %d of %d of the message)", p.Opcode, wantOp, k+1, per)
			case p.DestQP != to.qpn:
				return fmt.Sprintf("destination QP %#x, want %#x (the address lines)", p.DestQP, to.qpn)
			case p.AckReq:
				return "AckReq set on a UC packet"
			case p.PSN != wantPSN:
				return fmt.Sprintf("PSN %#06x, want %#06x (first: the announced PSN, then consecutive)", p.PSN, wantPSN)
			case len(p.Data) != wantLen:
				return fmt.Sprintf("%d bytes, want %d", len(p.Data), wantLen)
			}
			return pingpongData(p)
		}, nil
	}
}
