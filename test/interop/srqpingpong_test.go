//go:build linux

package interop

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
)

// srqCells returns the ibv_srq_pingpong cells, rocev2d as server and as
// client: 16 QPs (the tool's default) on one SRQ each side with 4096-byte
// messages (SEND_FIRST, 2 MIDDLE, LAST at the lab's MTU), and 4 QPs with
// 64-byte messages; -n counts the exchanges over all QPs, -c on both
// sides. The capture is followed per QP pair (the address lines name
// them); every SEND must carry zeros (the tool's buffer), go to a QP its
// peer announced, in PSN order from the announced PSN. A side stops with
// up to one send per QP in flight, so the message counts are not fixed:
// rxe's rdma_recvs must equal rocev2d's SEND messages in the capture, and
// its rdma_sends (completed sends) lie between -n and its SEND messages.
func srqCells(gidIndex int) []cell {
	var cs []cell
	n := iters()
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, tc := range []struct{ qps, size int }{{16, 4096}, {4, 64}} {
			qps, size := tc.qps, tc.size
			perMsg := (size + labMTU - 1) / labMTU
			cs = append(cs, cell{
				name:     fmt.Sprintf("srq_pingpong_%dqp_%d_rocev2d_%s", qps, size, role),
				label:    fmt.Sprintf("ibv_srq_pingpong -q %d -s %d -n %d -c", qps, size, n),
				tool:     fmt.Sprintf("ibv_srq_pingpong -d rxe0 -g %d -q %d -n %d -s %d -c", gidIndex, qps, n, size),
				toolName: "ibv_srq_pingpong",
				ours: []string{"srq-pingpong", "--bind", HostIP, "-q", strconv.Itoa(qps), "-s", strconv.Itoa(size), "-n", strconv.Itoa(n),
					"-c", "-v", "--timeout", "120s"},
				check:        func(who, out string) []string { return checkSRQPingpongOutput(who, out, qps, size, n) },
				data:         srqPingpongData(size),
				dataWhat:     "every packet: an RC SEND (ONLY, or FIRST/MIDDLE/LAST at MTU 1024) to a QP the peer announced, PSNs consecutive per QP from the announced one, all zeros",
				qpPairs:      srqPairs,
				counterCheck: func(d func(string) int64, st *CaptureStats, _ string) []string { return srqCounters(d, st, qps, n) },
				rxeCounters:  map[string]int64{"rdma_recvs": -1, "rdma_sends": -1},
				// The host's and the VM's address lines: the tool's
				// and rocev2d's QPs must be the same pairs.
				rocev2dServer: server,
				minPkts:       2 * n * perMsg,
			})
		}
	}
	return cs
}

// srqQP is the QPN and first PSN of one address line.
type srqQP struct{ qpn, psn uint32 }

// reRCAddr matches the address lines of ibv_{rc,srq}_pingpong and rocev2d's.
var reRCAddr = regexp.MustCompile(`(?m)^  (local|remote) address: +LID 0x[0-9a-f]{4}, QPN (0x[0-9a-f]{6}), PSN (0x[0-9a-f]{6}), GID \S+$`)

// srqAddrs returns the QPNs and first PSNs of a srq-pingpong's address
// lines, in order: its own (local) and the peer's (remote), as many each.
func srqAddrs(out string) (loc, rem []srqQP, err error) {
	for _, m := range reRCAddr.FindAllStringSubmatch(out, -1) {
		q, _ := strconv.ParseUint(m[2], 0, 32)
		p, _ := strconv.ParseUint(m[3], 0, 32)
		if m[1] == "local" {
			loc = append(loc, srqQP{uint32(q), uint32(p)})
		} else {
			rem = append(rem, srqQP{uint32(q), uint32(p)})
		}
	}
	if len(loc) == 0 || len(loc) != len(rem) {
		return nil, nil, fmt.Errorf("%d local and %d remote address lines, want as many of each", len(loc), len(rem))
	}
	return loc, rem, nil
}

// srqPairs returns the QP pairs of a srq-pingpong from rocev2d's output:
// its QP i and the tool's QP i.
func srqPairs(hostOut string) ([][2]uint32, error) {
	loc, rem, err := srqAddrs(hostOut)
	if err != nil {
		return nil, err
	}
	pairs := make([][2]uint32, len(loc))
	for i := range loc {
		pairs[i] = [2]uint32{loc[i].qpn, rem[i].qpn}
	}
	return pairs, nil
}

// checkSRQPingpongOutput checks a srq-pingpong output: the result lines
// as a pingpong's (checkPingpongOutput; -n counts all QPs' exchanges) and
// qps local and qps remote address lines, all local ones first.
func checkSRQPingpongOutput(who, out string, qps, size, n int) []string {
	p := checkPingpongOutput(who, out, size, n)
	loc, _, err := srqAddrs(out)
	if err != nil {
		return append(p, who+": "+err.Error())
	}
	if len(loc) != qps {
		p = append(p, fmt.Sprintf("%s: %d QPs in the address lines, want %d", who, len(loc), qps))
	}
	if i, j := strings.Index(out, "  remote address:"), strings.LastIndex(out, "  local address:"); i < j {
		p = append(p, who+": a local address line after a remote one")
	}
	return p
}

// srqPingpongData returns the wire check of a srq-pingpong cell from
// rocev2d's address lines: every packet an RC SEND to a QP its receiver
// announced, PSNs consecutive per QP from the sender's announced PSN
// (resends are placed by the capture analysis and only their data is
// checked), each message ceil(size/labMTU) packets — SEND_ONLY, or
// SEND_FIRST, MIDDLE..., LAST — of labMTU bytes but the last, all zeros.
func srqPingpongData(size int) func(hostOut string) (DataCheck, error) {
	return func(hostOut string) (DataCheck, error) {
		loc, rem, err := srqAddrs(hostOut)
		if err != nil {
			return nil, err
		}
		per := max(1, (size+labMTU-1)/labMTU)
		type qpState struct {
			next uint32 // the next PSN
			k    int    // the next packet's index in its message
		}
		// By sender (true: the host) and destination QP.
		qps := map[bool]map[uint32]*qpState{true: {}, false: {}}
		for i := range loc {
			qps[true][rem[i].qpn] = &qpState{next: loc[i].psn}
			qps[false][loc[i].qpn] = &qpState{next: rem[i].psn}
		}
		return func(p Payload) string {
			q := qps[p.FromHost][p.DestQP]
			if q == nil {
				return fmt.Sprintf("destination QP %#x: not one of the receiver's address lines", p.DestQP)
			}
			if i := bytes.IndexFunc(p.Data, func(r rune) bool { return r != 0 }); i >= 0 {
				return fmt.Sprintf("byte %d is %#x, want 0 (ibv_srq_pingpong's buffer is zero)", i, p.Data[i])
			}
			if p.Resent {
				return ""
			}
			k := q.k
			q.k = (k + 1) % per
			wantPSN := q.next
			q.next = (p.PSN + 1) & 0xffffff
			wantOp := bth.RCSendMiddle
			switch {
			case per == 1:
				wantOp = bth.RCSendOnly
			case k == 0:
				wantOp = bth.RCSendFirst
			case k == per-1:
				wantOp = bth.RCSendLast
			}
			wantLen := labMTU
			if k == per-1 {
				wantLen = size - (per-1)*labMTU
			}
			switch {
			case p.Opcode != wantOp:
				return fmt.Sprintf("opcode %s, want %s (packet %d of %d of the message)", p.Opcode, wantOp, k+1, per)
			case p.PSN != wantPSN:
				return fmt.Sprintf("PSN %#06x on QP %#x, want %#06x (first: the announced PSN, then consecutive)", p.PSN, p.DestQP, wantPSN)
			case len(p.Data) != wantLen:
				return fmt.Sprintf("%d bytes, want %d", len(p.Data), wantLen)
			}
			return ""
		}, nil
	}
}

// srqCounters checks rxe's message counters against the capture: rxe
// took a receive for every SEND message of rocev2d's (rdma_recvs), and
// completed at least -n of its own and at most as many as it sent, which
// is at most -n plus one per QP but the last (the tool's loop posts a
// QP's next send while fewer than -n sends have completed in all).
func srqCounters(delta func(string) int64, st *CaptureStats, qps, n int) []string {
	var p []string
	host, vm := int64(st.Messages["host SEND"]), int64(st.Messages["vm SEND"])
	if d := delta("rdma_recvs"); d != host {
		p = append(p, fmt.Sprintf("rxe rdma_recvs moved by %d, the capture holds %d SEND messages from rocev2d", d, host))
	}
	if d := delta("rdma_sends"); d < int64(n) || d > vm {
		p = append(p, fmt.Sprintf("rxe rdma_sends moved by %d, want %d..%d (the SEND messages from rxe in the capture)", d, n, vm))
	}
	for who, m := range map[string]int64{"rocev2d": host, "rxe": vm} {
		if m < int64(n) || m > int64(n+qps-1) {
			p = append(p, fmt.Sprintf("%s sent %d SEND messages, want %d..%d", who, m, n, n+qps-1))
		}
	}
	return p
}

// TestAnalyzeSRQPingpong: with the QP pairs of the address lines, the
// capture analysis follows each pair's PSNs on its own (two QPs whose
// PSN spaces interleave are no resends), counts the SEND messages per
// sender, and srqPingpongData accepts the exchange and flags a non-zero
// byte, a wrong PSN, an unannounced QP and a wrong opcode sequence.
func TestAnalyzeSRQPingpong(t *testing.T) {
	const size = 2048 // FIRST 1024, LAST 1024
	out := "  local address:  LID 0x0000, QPN 0x000011, PSN 0x000100, GID ::ffff:192.0.2.1\n" +
		"  local address:  LID 0x0000, QPN 0x000012, PSN 0xfffffe, GID ::ffff:192.0.2.1\n" +
		"  remote address: LID 0x0000, QPN 0x000021, PSN 0x000050, GID ::ffff:192.0.2.2\n" +
		"  remote address: LID 0x0000, QPN 0x000022, PSN 0x000080, GID ::ffff:192.0.2.2\n"
	zero := make([]byte, 1024)
	send := func(fromHost bool, dst, psn uint32, op bth.Opcode, payload []byte) []byte {
		return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: op, PKey: 0xffff, DestQP: dst, PSN: bth.PSN(psn), AckReq: op == bth.RCSendLast}, Payload: payload})
	}
	ack := func(fromHost bool, dst, psn uint32) []byte {
		return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: dst, PSN: bth.PSN(psn)}, AETH: aeth.Fields{Syndrome: aeth.ACK(aeth.NoCreditLimit)}})
	}
	msg := func(fromHost bool, dst, psn uint32) [][]byte {
		return [][]byte{send(fromHost, dst, psn, bth.RCSendFirst, zero), send(fromHost, dst, psn+1, bth.RCSendLast, zero)}
	}
	var good [][]byte
	good = append(good, msg(true, 0x21, 0x100)...)    // host QP 0x11 -> vm QP 0x21
	good = append(good, msg(true, 0x22, 0xfffffe)...) // host QP 0x12 -> vm QP 0x22, PSNs wrap, behind QP 0x11's
	good = append(good, ack(false, 0x11, 0x101), ack(false, 0x12, 0xffffff))
	good = append(good, msg(false, 0x11, 0x50)...)
	good = append(good, msg(false, 0x12, 0x80)...)
	good = append(good, ack(true, 0x21, 0x51), ack(true, 0x22, 0x81))
	good = append(good, msg(true, 0x21, 0x102)...)
	good = append(good, msg(true, 0x22, 0x000000)...)
	pairs, err := srqPairs(out)
	if err != nil {
		t.Fatal(err)
	}
	check, err := srqPingpongData(size)(out)
	if err != nil {
		t.Fatal(err)
	}
	st, err := analyzePairs(bytes.NewReader(pcapOf(t, good...)), check, pairs)
	if err != nil {
		t.Fatal(err)
	}
	if st.DataChecked != 12 || st.DataBad != 0 || st.RetransFromHost+st.RetransFromVM != 0 ||
		st.Messages["host SEND"] != 4 || st.Messages["vm SEND"] != 2 {
		t.Fatalf("checked %d bad %d resent %d/%d messages %v %q", st.DataChecked, st.DataBad, st.RetransFromHost, st.RetransFromVM, st.Messages, st.DataLines)
	}
	// Without the pairs the two QPs' PSNs look like resends.
	if st, _ := analyzePairs(bytes.NewReader(pcapOf(t, good...)), nil, nil); st.RetransFromHost == 0 {
		t.Errorf("without pairs: no resends counted; the test does not interleave PSN spaces")
	}
	// A resend is placed in its own QP's flow: counted once, data checked.
	resent := append(append([][]byte{}, good...), send(true, 0x21, 0x102, bth.RCSendFirst, zero))
	check, _ = srqPingpongData(size)(out)
	if st, _ := analyzePairs(bytes.NewReader(pcapOf(t, resent...)), check, pairs); st.RetransFromHost != 1 || st.DataBad != 0 || st.Messages["host SEND"] != 4 {
		t.Errorf("resend: resent %d bad %d messages %v %q", st.RetransFromHost, st.DataBad, st.Messages, st.DataLines)
	}

	nonzero := append([]byte{}, zero...)
	nonzero[7] = 0x7b
	for _, tc := range []struct {
		name  string
		frame []byte
		want  string
	}{
		{"non-zero byte", send(true, 0x21, 0x100, bth.RCSendFirst, nonzero), "byte 7 is 0x7b"},
		{"wrong PSN", send(true, 0x21, 0x101, bth.RCSendFirst, zero), "want 0x000100"},
		{"unannounced QP", send(true, 0x23, 0x100, bth.RCSendFirst, zero), "destination QP 0x23"},
		{"ONLY for a 2-packet message", send(true, 0x21, 0x100, bth.RCSendOnly, zero), "want RC_SEND_FIRST"},
	} {
		check, _ := srqPingpongData(size)(out)
		st, err := analyzePairs(bytes.NewReader(pcapOf(t, tc.frame)), check, pairs)
		if err != nil || st.DataBad != 1 || !strings.Contains(strings.Join(st.DataLines, ";"), tc.want) {
			t.Errorf("%s: bad %d %q (want %q) %v", tc.name, st.DataBad, st.DataLines, tc.want, err)
		}
	}
	if _, err := srqPingpongData(size)("no address lines"); err == nil {
		t.Error("no address lines: no error")
	}
}

func TestCheckSRQPingpongOutput(t *testing.T) {
	out := "  local address:  LID 0x0000, QPN 0x000011, PSN 0x000100, GID ::ffff:192.0.2.1\n" +
		"  local address:  LID 0x0000, QPN 0x000012, PSN 0xfffffe, GID ::ffff:192.0.2.1\n" +
		"  remote address: LID 0x0000, QPN 0x000021, PSN 0x000050, GID ::ffff:192.0.2.2\n" +
		"  remote address: LID 0x0000, QPN 0x000022, PSN 0x000080, GID ::ffff:192.0.2.2\n" +
		"409600 bytes in 0.05 seconds = 65.54 Mbit/sec\n100 iters in 0.05 seconds = 500.00 usec/iter\n"
	if p := checkSRQPingpongOutput("x", out, 2, 2048, 100); len(p) != 0 {
		t.Errorf("good output: %q", p)
	}
	if p := checkSRQPingpongOutput("x", out, 16, 2048, 100); len(p) != 1 || !strings.Contains(p[0], "2 QPs") {
		t.Errorf("wrong QP count: %q", p)
	}
	if p := checkSRQPingpongOutput("x", out+"invalid data in page 0\n", 2, 2048, 100); len(p) != 1 {
		t.Errorf("-c complaint: %q", p)
	}
}
