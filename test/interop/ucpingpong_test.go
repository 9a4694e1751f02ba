//go:build linux

package interop

import (
	"bytes"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// ucCells returns the ibv_uc_pingpong cells, rocev2d as server and as
// client: 64 bytes (one UC SEND_ONLY per message), 1024 (one packet at the
// lab's path MTU) and 4096 (SEND_FIRST, 2 MIDDLE, LAST), with -c on both
// sides. UC has no ACKs and no retransmission: every packet on the wire
// is a message's, and a lost one would stall the cell (rocev2d
// --timeout). rxe counts a send completion per message it sent and a
// receive completion per message it took whole; rocev2d's
// uc_msgs_dropped (with the other drop counters, ourDropCounters) must
// stay 0.
func ucCells(gidIndex int) []cell {
	var cs []cell
	n := iters()
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, size := range []int{64, 1024, 4096} {
			perMsg := (size + labMTU - 1) / labMTU
			cs = append(cs, cell{
				name:          fmt.Sprintf("uc_pingpong_%d_rocev2d_%s", size, role),
				label:         fmt.Sprintf("ibv_uc_pingpong -s %d -n %d -c", size, n),
				tool:          fmt.Sprintf("ibv_uc_pingpong -d rxe0 -g %d -n %d -s %d -c", gidIndex, n, size),
				toolName:      "ibv_uc_pingpong",
				ours:          []string{"uc-pingpong", "--bind", HostIP, "-s", strconv.Itoa(size), "-n", strconv.Itoa(n), "-c", "-v", "--timeout", "120s"},
				check:         func(who, out string) []string { return checkUCPingpongOutput(who, out, size, n) },
				data:          ucPingpongData(size),
				dataWhat:      "every packet: a UC SEND (ONLY, or FIRST/MIDDLE/LAST at MTU 1024) without AckReq, to the announced QPN, PSNs consecutive from the announced one, the -c buffer",
				rxeCounters:   map[string]int64{"rdma_recvs": int64(n), "rdma_sends": int64(n)},
				rocev2dServer: server,
				minPkts:       2 * n * perMsg,
				wantPkts:      2 * n * perMsg,
			})
		}
	}
	return cs
}

// reUCAddrLine matches the address lines of ibv_uc_pingpong (the same as
// ibv_rc_pingpong's) and rocev2d uc-pingpong: ", GID" on both.
var reUCAddrLine = regexp.MustCompile(`^  (local address: |remote address:) LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID \S+$`)

// checkUCPingpongOutput checks a uc-pingpong output like a pingpong's
// (checkPingpongOutput: the result lines, -c's complaints) and its two
// address lines.
func checkUCPingpongOutput(who, out string, size, n int) []string {
	p := checkPingpongOutput(who, out, size, n)
	lines := 0
	for _, l := range strings.Split(out, "\n") {
		if reUCAddrLine.MatchString(l) {
			lines++
		}
	}
	if lines != 2 {
		p = append(p, fmt.Sprintf("%s: %d address lines in ibv_uc_pingpong's format, want 2", who, lines))
	}
	return p
}

// TestAnalyzeUCPingpong: UC SENDs are tracked like RC requests (placed in
// their message, resends counted) and handed to ucPingpongData, which
// follows the QPNs and PSNs of rocev2d's address lines and flags a wrong
// opcode sequence, QP, AckReq, PSN, length and -c buffer.
func TestAnalyzeUCPingpong(t *testing.T) {
	const size = 2500 // FIRST 1024, MIDDLE 1024, LAST 452
	out := "  local address:  LID 0x0000, QPN 0x000011, PSN 0xfffffe, GID ::ffff:192.0.2.1\n" +
		"  remote address: LID 0x0000, QPN 0x000022, PSN 0x000100, GID ::ffff:192.0.2.2\n"
	buf := ppBuf(size)
	uc := func(fromHost bool, psn uint32, op bth.Opcode, payload []byte) []byte {
		dst := uint32(0x11)
		if fromHost {
			dst = 0x22
		}
		return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: op, PKey: 0xffff, DestQP: dst, PSN: bth.PSN(psn)}, Payload: payload})
	}
	msg := func(fromHost bool, psn uint32) [][]byte {
		return [][]byte{
			uc(fromHost, psn, bth.UCSendFirst, buf[:1024]),
			uc(fromHost, psn+1, bth.UCSendMiddle, buf[1024:2048]),
			uc(fromHost, psn+2, bth.UCSendLast, buf[2048:]),
		}
	}
	var good [][]byte
	good = append(good, msg(true, 0xfffffe)...) // the host's PSNs wrap
	good = append(good, msg(false, 0x100)...)
	good = append(good, msg(true, 0x000001)...)
	good = append(good, msg(false, 0x103)...)
	mk := ucPingpongData(size)
	check, err := mk(out)
	if err != nil {
		t.Fatal(err)
	}
	st, err := analyzeWith(bytes.NewReader(pcapOf(t, good...)), check)
	if err != nil {
		t.Fatal(err)
	}
	if st.DataChecked != 12 || st.DataBad != 0 || st.DataUnplaced != 0 || st.RetransFromHost+st.RetransFromVM != 0 ||
		st.Opcodes["host UC_SEND_MIDDLE"] != 2 || st.Opcodes["vm   UC_SEND_LAST"] != 2 {
		t.Fatalf("checked %d bad %d unplaced %d resent %d/%d %q %v", st.DataChecked, st.DataBad, st.DataUnplaced,
			st.RetransFromHost, st.RetransFromVM, st.DataLines, st.Opcodes)
	}

	plain := bytes.Repeat([]byte{0x7b}, size)
	ackReq := packet.Fields{BTH: bth.Fields{Opcode: bth.UCSendFirst, PKey: 0xffff, DestQP: 0x22, PSN: 0xfffffe, AckReq: true}, Payload: buf[:1024]}
	for _, tc := range []struct {
		frames [][]byte
		want   string
	}{
		{[][]byte{uc(true, 0xfffffe, bth.UCSendOnly, buf[:1024])}, "opcode UC_SEND_ONLY, want UC_SEND_FIRST"},
		{[][]byte{uc(true, 0xfffffe, bth.RCSendFirst, buf[:1024])}, "opcode RC_SEND_FIRST"},
		{[][]byte{uc(true, 0xfffffe, bth.UCSendFirst, buf[:1024]), uc(true, 0xffffff, bth.UCSendLast, buf[1024:])}, "want UC_SEND_MIDDLE"},
		{[][]byte{uc(true, 0xfffffd, bth.UCSendFirst, buf[:1024])}, "PSN 0xfffffd, want 0xfffffe"},
		{[][]byte{uc(false, 0x100, bth.UCSendFirst, buf[:1000])}, "1000 bytes, want 1024"},
		{[][]byte{uc(false, 0x100, bth.UCSendFirst, plain[:1024])}, "message byte 0 is 0x7b"},
		{[][]byte{frame(t, true, ackReq)}, "AckReq set"},
		{[][]byte{frame(t, false, packet.Fields{BTH: bth.Fields{Opcode: bth.UCSendFirst, PKey: 0xffff, DestQP: 0x12, PSN: 0x100}, Payload: buf[:1024]})},
			"destination QP 0x12, want 0x11"},
	} {
		check, _ := mk(out)
		st, err := analyzeWith(bytes.NewReader(pcapOf(t, tc.frames...)), check)
		if err != nil {
			t.Fatal(err)
		}
		if st.DataBad != 1 || !strings.Contains(st.DataLines[0], tc.want) {
			t.Errorf("want %q, got bad %d %q", tc.want, st.DataBad, st.DataLines)
		}
	}
	// A resent UC packet (UC never resends) shows as a resend.
	st, err = analyzeWith(bytes.NewReader(pcapOf(t, append(msg(true, 0xfffffe), uc(true, 0xffffff, bth.UCSendMiddle, buf[1024:2048]))...)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetransFromHost != 1 {
		t.Errorf("a repeated UC PSN: %d resends counted, want 1", st.RetransFromHost)
	}
	if _, err := mk("no address lines"); err == nil {
		t.Error("ucPingpongData accepted an output without address lines")
	}
}

// TestAnalyzeCaptureGoldenUC: rxe's own ibv_uc_pingpong -s 4096 -n 5
// (uc_send_4096.pcap, between two VMs) decodes with good ICRCs, 4 UC
// packets per message, no resend.
func TestAnalyzeCaptureGoldenUC(t *testing.T) {
	dir := goldendir.Require(t)
	st, err := AnalyzeCapture(filepath.Join(dir, "uc_send_4096.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	if st.RoCE != 40 || st.BadICRC != 0 || st.Bad != 0 || st.Opcodes["vm   UC_SEND_FIRST"] != 10 ||
		st.Opcodes["vm   UC_SEND_MIDDLE"] != 20 || st.Opcodes["vm   UC_SEND_LAST"] != 10 {
		t.Fatalf("stats %v", st)
	}
}

// TestCheckUCPingpongOutput: the golden run's output passes; a UD-style
// local line or a missing result line does not.
func TestCheckUCPingpongOutput(t *testing.T) {
	good := "  local address:  LID 0x0000, QPN 0x000013, PSN 0x468b96, GID ::ffff:192.0.2.2\n" +
		"  remote address: LID 0x0000, QPN 0x000013, PSN 0xc9cde5, GID ::ffff:192.0.2.3\n" +
		"40960 bytes in 0.02 seconds = 15.92 Mbit/sec\n5 iters in 0.02 seconds = 4117.20 usec/iter\n"
	if p := checkUCPingpongOutput("tool", good, 4096, 5); p != nil {
		t.Fatalf("golden output: %q", p)
	}
	if p := checkUCPingpongOutput("tool", strings.Replace(good, "0x468b96, GID", "0x468b96: GID", 1), 4096, 5); len(p) != 1 || !strings.Contains(p[0], "1 address lines") {
		t.Errorf("UD-style line: %q", p)
	}
	if p := checkUCPingpongOutput("tool", good+"invalid data in page 0\n", 4096, 5); len(p) != 1 || !strings.Contains(p[0], "invalid data") {
		t.Errorf("-c complaint: %q", p)
	}
}
