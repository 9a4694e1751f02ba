//go:build linux

package interop

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

// mwSize is the window length of the memory-window cells: 4 packets per
// WRITE, SEND and READ at the lab's MTU.
const mwSize = 4096

// mwCells returns the memory-window cells (rv2imm -o mw, the rocev2 side
// in process like the immediate cells): rocev2d as the requester with
// rxe's windows (rv2imm server in the VM: ibv_bind_mw for the type 1
// window, an IBV_WR_BIND_MW work request for the type 2 one,
// IBV_WR_LOCAL_INV, a receive of the SEND with Invalidate), and rxe as
// the requester with rocev2d's windows (QP.BindMW, WRBindMW, WRLocalInv).
// Both see READ and WRITE through both windows, a WRITE through the
// rebound type 2 window, a SEND with Invalidate of it, and a one-packet
// WRITE after that, which the owner refuses with the remote access NAK: the
// requester's completion is IBV_WC_REM_ACCESS_ERR and both QPs end in ERR.
// On the wire: every byte (by window and step), the R_Keys of the WRITEs
// and of the IETH, exactly one NAK — the owner's REMOTE_ACCESS_ERROR —
// and the requester's 2 READs, 4 WRITEs and 1 SEND.
func mwCells(gidIndex int) []cell {
	var cs []cell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		owner := map[bool]string{true: "rocev2d's windows, rxe requester", false: "rxe's windows, rocev2d requester"}[server]
		// rxe's message counters: its SEND with Invalidate, or its
		// receive of ours.
		counters := map[string]int64{"rdma_sends": 1, "rdma_recvs": 0}
		if !server {
			counters = map[string]int64{"rdma_sends": 0, "rdma_recvs": 1}
		}
		cs = append(cs, cell{
			name:     "mw_" + strconv.Itoa(mwSize) + "_rocev2d_" + role,
			label:    fmt.Sprintf("rv2imm -o mw -s %d (%s)", mwSize, owner),
			tool:     fmt.Sprintf("rv2imm -d rxe0 -g %d -o mw -s %d", gidIndex, mwSize),
			toolName: "rv2imm",
			port:     immPort,
			inproc: func(ctx context.Context, lab *Lab, ready chan<- error) (int, string) {
				var out strings.Builder
				if err := runImm(ctx, lab, immConfig{mw: true, size: mwSize, requester: !server}, &out, ready); err != nil {
					fmt.Fprintf(&out, "error: %v\n", err)
					return 1, out.String()
				}
				return 0, out.String()
			},
			check: func(who, out string) []string {
				if !reMWResult.MatchString(out) {
					return []string{who + ": no \"memory windows (...): ok\" line"}
				}
				return nil
			},
			data:     mwData(mwSize),
			dataWhat: "every WRITE, READ response and SEND by window and step (patterns 1..7), the WRITEs' and the IETH's R_Keys",
			counterCheck: func(_ func(string) int64, st *CaptureStats, _ string) []string {
				return mwWire(st, !server)
			},
			rxeCounters:   counters,
			rocev2dServer: server,
			// The requester's 2 READ requests, 4 messages of 4 packets
			// and the refused one-packet WRITE, the owner's 2 READ
			// responses of 4 packets and at least the NAK.
			minPkts: 2 + 4*4 + 1 + 2*4 + 1,
		})
	}
	return cs
}

// mwWire checks the capture of a memory-window cell: the requester
// (rocev2d when hostRequester) sent 2 READs, 4 WRITEs and 1 SEND, the
// owner none; the only NAK is the owner's remote access error.
func mwWire(st *CaptureStats, hostRequester bool) []string {
	req, own := "vm", "host"
	if hostRequester {
		req, own = "host", "vm"
	}
	var p []string
	want := map[string]int{req + " RDMA_READ_REQUEST": 2, req + " RDMA_WRITE": 4, req + " SEND": 1}
	for k, n := range st.Messages {
		if want[k] != n {
			p = append(p, fmt.Sprintf("capture: %d %s messages, want %d", n, k, want[k]))
		}
	}
	for k, n := range want {
		if _, ok := st.Messages[k]; !ok {
			p = append(p, fmt.Sprintf("capture: no %s message, want %d", k, n))
		}
	}
	nak := own + " NAK " + aeth.NAKRemoteAccessError.String()
	if len(st.NAKs) != 1 || st.NAKs[nak] != 1 {
		p = append(p, fmt.Sprintf("capture: NAKs %v, want exactly one %q", st.NAKs, nak))
	}
	return p
}

// reMWWindows matches the "windows:" line either side of an -o mw run
// prints; reMWRKeys its result line's three rkeys.
var (
	reMWWindows = regexp.MustCompile(`(?m)^windows: type 1 rkey (0x[0-9a-f]{8}) va (0x[0-9a-f]{16}), type 2 rkey (0x[0-9a-f]{8}) va (0x[0-9a-f]{16}), length (\d+)$`)
	reMWRKeys   = regexp.MustCompile(`(?m)^memory windows \((?:requester|responder), rkeys (0x[0-9a-f]{8}) (0x[0-9a-f]{8}) (0x[0-9a-f]{8})\)`)
)

// mwData returns the wire check of a memory-window cell from rocev2d's
// output (the windows' addresses and rkeys): READ responses from window
// 1 carry pattern 1, from window 2 pattern 2; WRITEs to window 1 carry
// pattern 3 and use rkey 1; the WRITEs to window 2, in order, patterns 4
// (rkey 2), 5 and 7 (the rebound rkey); the SEND pattern 6 and an IETH
// naming the rebound rkey.
func mwData(n int) func(hostOut string) (DataCheck, error) {
	return func(hostOut string) (DataCheck, error) {
		w := reMWWindows.FindStringSubmatch(hostOut)
		k := reMWRKeys.FindStringSubmatch(hostOut)
		if w == nil || k == nil {
			return nil, fmt.Errorf("rocev2d printed no windows and rkeys lines")
		}
		hex := func(s string) uint64 { v, _ := strconv.ParseUint(s, 0, 64); return v }
		rkey1, va1, rkey2, va2 := uint32(hex(w[1])), hex(w[2]), uint32(hex(w[3])), hex(w[4])
		rkey2b := uint32(hex(k[3]))
		if l, _ := strconv.Atoi(w[5]); l != n {
			return nil, fmt.Errorf("window length %d, want %d", l, n)
		}
		in := func(va, base uint64) bool { return va >= base && va < base+uint64(n) }
		writes2 := 0 // WRITE messages to window 2 so far
		return func(p Payload) string {
			if p.MsgOff < 0 {
				return ""
			}
			var pat int
			var wantKey uint32
			kind := p.Opcode.Info().Kind
			switch {
			case kind == bth.KindReadResponse && p.HasVA && in(p.VA, va1):
				pat = mwPatWin1
			case kind == bth.KindReadResponse && p.HasVA && in(p.VA, va2):
				pat = mwPatWin2
			case kind == bth.KindWrite && p.HasVA && in(p.VA, va1):
				pat, wantKey = mwPatWrite1, rkey1
			case kind == bth.KindWrite && p.HasVA && in(p.VA, va2):
				g := writes2 - 1
				if p.MsgOff == 0 && !p.Resent {
					g = writes2
					writes2++
				}
				switch g {
				case 0:
					pat, wantKey = mwPatWrite2, rkey2
				case 1:
					pat, wantKey = mwPatRebound, rkey2b
				case 2:
					pat, wantKey = mwPatForbidden, rkey2b
				default:
					return fmt.Sprintf("WRITE %d to the type 2 window, want 3", g+1)
				}
			case kind == bth.KindSend:
				pat = mwPatSendInv
				if p.Opcode.Info().Inv {
					wantKey = rkey2b
				}
			default:
				return fmt.Sprintf("%s at VA %#x (has VA %v): not a window's nor the SEND", p.Opcode, p.VA, p.HasVA)
			}
			if p.RKey != 0 && wantKey != 0 && p.RKey != wantKey {
				return fmt.Sprintf("R_Key %#08x, want %#08x", p.RKey, wantKey)
			}
			if wantKey != 0 && p.RKey == 0 && (p.MsgOff == 0 && kind == bth.KindWrite || p.Opcode.Info().Inv) {
				return "no R_Key"
			}
			off := p.MsgOff
			if p.HasVA && kind != bth.KindSend {
				off = int(p.VA - map[bool]uint64{true: va1, false: va2}[in(p.VA, va1)])
			}
			for i, b := range p.Data {
				if want := immPattern(pat, off+i); b != want {
					return fmt.Sprintf("byte %d (offset %d) is %#x, want %#x (pattern %d)", i, off+i, b, want, pat)
				}
			}
			return ""
		}, nil
	}
}

// TestMWData: mwData accepts the exchange of an -o mw run as it appears
// on the wire (both READ responses, the WRITEs in order, the SEND with
// Invalidate), and flags a wrong byte, a wrong R_Key and a fourth WRITE;
// mwWire counts the messages and wants exactly the owner's remote access
// NAK.
func TestMWData(t *testing.T) {
	const n = 2048
	va1, va2 := uint64(0x10000), uint64(0x10000+n)
	out := fmt.Sprintf("windows: type 1 rkey 0x00000105 va 0x%016x, type 2 rkey 0x00000208 va 0x%016x, length %d\n", va1, va2, n) +
		"memory windows (requester, rkeys 0x00000105 0x00000208 0x00000209): ... : ok\n"
	pat := func(i, off, l int) []byte {
		b := make([]byte, l)
		for k := range b {
			b[k] = immPattern(i, off+k)
		}
		return b
	}
	psn := uint32(0x100)
	var frames [][]byte
	req := func(f packet.Fields) {
		f.BTH.PKey, f.BTH.DestQP, f.BTH.PSN = 0xffff, 0x22, bth.PSN(psn)
		frames = append(frames, frame(t, true, f))
		psn++
	}
	write := func(va uint64, rkey uint32, i int) {
		req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteFirst}, RETH: reth.Fields{VA: va, RKey: rkey, DMALength: n}, Payload: pat(i, 0, 1024)})
		req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteLast, AckReq: true}, Payload: pat(i, 1024, 1024)})
	}
	read := func(va uint64, rkey uint32, i int) {
		first := psn
		req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest}, RETH: reth.Fields{VA: va, RKey: rkey, DMALength: n}})
		psn++ // two response PSNs
		for k, op := range []bth.Opcode{bth.RCReadResponseFirst, bth.RCReadResponseLast} {
			frames = append(frames, frame(t, false, packet.Fields{BTH: bth.Fields{Opcode: op, PKey: 0xffff, DestQP: 0x11, PSN: bth.PSN(first + uint32(k))},
				AETH: aeth.Fields{Syndrome: aeth.ACK(aeth.NoCreditLimit)}, Payload: pat(i, 1024*k, 1024)}))
		}
	}
	read(va1, 0x105, mwPatWin1)
	read(va2, 0x208, mwPatWin2)
	write(va1, 0x105, mwPatWrite1)
	write(va2, 0x208, mwPatWrite2)
	write(va2, 0x209, mwPatRebound)
	req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendFirst}, Payload: pat(mwPatSendInv, 0, 1024)})
	req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendLastInv, AckReq: true}, IETHRKey: 0x209, Payload: pat(mwPatSendInv, 1024, 1024)})
	write(va2, 0x209, mwPatForbidden)
	nakPSN := psn - 2
	good := append(frames, frame(t, false, packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x11, PSN: bth.PSN(nakPSN)},
		AETH: aeth.Fields{Syndrome: aeth.NAK(aeth.NAKRemoteAccessError)}}))

	check, err := mwData(n)(out)
	if err != nil {
		t.Fatal(err)
	}
	st, err := analyzeWith(bytes.NewReader(pcapOf(t, good...)), check)
	if err != nil {
		t.Fatal(err)
	}
	if st.DataChecked != 14 || st.DataBad != 0 || st.DataUnplaced != 0 {
		t.Fatalf("checked %d bad %d unplaced %d %q", st.DataChecked, st.DataBad, st.DataUnplaced, st.DataLines)
	}
	if p := mwWire(st, true); len(p) != 0 {
		t.Errorf("mwWire: %q (messages %v, NAKs %v)", p, st.Messages, st.NAKs)
	}
	if p := mwWire(st, false); len(p) == 0 {
		t.Error("mwWire with the roles swapped: no problem")
	}

	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"wrong byte", func() [][]byte {
			psn = 0x200
			frames = nil
			b := pat(mwPatWrite1, 0, 1024)
			b[5]++
			req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly}, RETH: reth.Fields{VA: va1, RKey: 0x105, DMALength: 1024}, Payload: b})
			return frames
		}(), "byte 5"},
		{"type 1 WRITE with the type 2 rkey", func() [][]byte {
			psn = 0x200
			frames = nil
			req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly}, RETH: reth.Fields{VA: va1, RKey: 0x208, DMALength: 1024}, Payload: pat(mwPatWrite1, 0, 1024)})
			return frames
		}(), "R_Key 0x00000208, want 0x00000105"},
		{"IETH naming the old rkey", func() [][]byte {
			psn = 0x200
			frames = nil
			req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnlyInv}, IETHRKey: 0x208, Payload: pat(mwPatSendInv, 0, 64)})
			return frames
		}(), "want 0x00000209"},
		{"a fourth WRITE to window 2", func() [][]byte {
			psn = 0x200
			frames = nil
			for i, p := range []int{mwPatWrite2, mwPatRebound, mwPatForbidden, mwPatForbidden} {
				req(packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly}, RETH: reth.Fields{VA: va2, RKey: []uint32{0x208, 0x209, 0x209, 0x209}[i], DMALength: 64}, Payload: pat(p, 0, 64)})
			}
			return frames
		}(), "WRITE 4 to the type 2 window"},
	} {
		check, _ := mwData(n)(out)
		st, err := analyzeWith(bytes.NewReader(pcapOf(t, tc.frames...)), check)
		if err != nil || st.DataBad != 1 || !strings.Contains(strings.Join(st.DataLines, ";"), tc.want) {
			t.Errorf("%s: bad %d %q (want %q) %v", tc.name, st.DataBad, st.DataLines, tc.want, err)
		}
	}
}
