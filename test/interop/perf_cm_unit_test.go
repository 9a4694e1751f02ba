//go:build linux

package interop

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/deth"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

// madFrame is a CM MAD from the host or the VM as a UD datagram to QP1.
func madFrame(t *testing.T, fromHost bool, psn uint32, m cm.Message) []byte {
	t.Helper()
	buf := make([]byte, 256)
	h := cm.NewHeader(0, 0x1234)
	if err := cm.Encode(buf, &h, m); err != nil {
		t.Fatal(err)
	}
	return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1, PSN: bth.PSN(psn)},
		DETH: deth.Fields{QKey: 0x80010000, SrcQP: 1}, Payload: buf})
}

func cmREQ(commID, qpn, psn uint32) *cm.REQFields {
	return &cm.REQFields{LocalCommID: commID, ServiceID: cm.ServiceID(cm.PSTCP, perfCMPort), LocalQPN: qpn,
		TransportServiceType: cm.TransportRC, StartingPSN: psn, PKey: 0xffff, PathMTU: cm.MTU(3), RetryCount: 7,
		RNRRetryCount: 7, MaxCMRetries: 15, RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20,
		Primary: cm.Path{LocalLID: 0xffff, RemoteLID: 0xffff, HopLimit: 64}}
}

// TestAnalyzePerfCM: a perftest -R capture holds two RC connections whose
// QPNs overlap across the sides (host 0x12 <-> VM 0x11 for the exchange,
// host 0x11 <-> VM 0x12 for the test, as rxe and rocev2d numbered them in
// the lab) and whose PSN spaces are unrelated: the analysis follows each
// connection the REQs and REPs set up on its own (no resend is seen where
// the two interleave), pairs the QPNs, counts the MADs, and the -R data
// check looks at the test connection only.
func TestAnalyzePerfCM(t *testing.T) {
	sendTo := func(fromHost bool, qp, psn uint32, payload []byte) []byte {
		return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: bth.RCSendOnly, PKey: 0xffff, DestQP: qp, PSN: bth.PSN(psn), AckReq: true}, Payload: payload})
	}
	ack := func(fromHost bool, qp, psn uint32) []byte {
		return frame(t, fromHost, packet.Fields{BTH: bth.Fields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: qp, PSN: bth.PSN(psn)},
			AETH: aeth.Fields{Syndrome: aeth.ACK(0x1f)}})
	}
	write := func(psn uint32, va uint64) []byte {
		pat := make([]byte, 1024)
		for i := range pat {
			pat[i] = perfPattern(int(va-0x7000) + i) // the pattern at its offset from the peer's VAddr
		}
		return frame(t, true, packet.Fields{BTH: bth.Fields{Opcode: bth.RCWriteOnly, PKey: 0xffff, DestQP: 0x12, PSN: bth.PSN(psn), AckReq: true},
			RETH: reth.Fields{VA: va, RKey: 0x77, DMALength: 1024}, Payload: pat})
	}
	frames := [][]byte{
		// The exchange's connection: rocev2d's QP 0x12 <-> rxe's 0x11.
		madFrame(t, true, 0, cmREQ(0xa, 0x12, 0x500)),
		madFrame(t, false, 0, &cm.REPFields{LocalCommID: 0xb, RemoteCommID: 0xa, LocalQPN: 0x11, StartingPSN: 0x900000, RNRRetryCount: 7}),
		madFrame(t, true, 1, &cm.RTUFields{LocalCommID: 0xa, RemoteCommID: 0xb}),
		sendTo(true, 0x11, 0x900000, make([]byte, 16)), // the version: not the pattern, and not checked
		ack(false, 0x12, 0x900000),
		sendTo(false, 0x12, 0x500, make([]byte, 16)),
		ack(true, 0x11, 0x500),
		// A REQ refused (perftest not listening yet), then the test QP's:
		// rocev2d's 0x11 <-> rxe's 0x12.
		madFrame(t, true, 2, cmREQ(0xc, 0x11, 0x100)),
		madFrame(t, false, 1, &cm.REJFields{RemoteCommID: 0xc, MessageRejected: cm.KindREQ, Reason: cm.RejInvalidServiceID}),
		madFrame(t, true, 3, cmREQ(0xd, 0x11, 0x100)),
		madFrame(t, false, 2, &cm.REPFields{LocalCommID: 0xe, RemoteCommID: 0xd, LocalQPN: 0x12, StartingPSN: 0x10, RNRRetryCount: 7}),
		madFrame(t, true, 4, &cm.RTUFields{LocalCommID: 0xd, RemoteCommID: 0xe}),
		// The test's WRITEs (PSNs from 0x10) between SENDs of the
		// exchange (PSNs from 0x900001): one flow would see resends.
		write(0x10, 0x7000),
		sendTo(true, 0x11, 0x900001, make([]byte, 56)),
		write(0x11, 0x7400),
		ack(false, 0x11, 0x11),
		ack(false, 0x12, 0x900001),
		write(0x11, 0x7400), // a real resend on the test connection
		madFrame(t, true, 5, &cm.DREQFields{LocalCommID: 0xd, RemoteCommID: 0xe, RemoteQPN: 0x12}),
		madFrame(t, false, 3, &cm.DREPFields{LocalCommID: 0xe, RemoteCommID: 0xd}),
		madFrame(t, true, 6, &cm.DREQFields{LocalCommID: 0xa, RemoteCommID: 0xb, RemoteQPN: 0x11}),
		madFrame(t, false, 4, &cm.DREPFields{LocalCommID: 0xb, RemoteCommID: 0xa}),
	}
	hostOut := " local address: LID 0000 QPN 0x0011 PSN 0x000010 RKey 0x000001 VAddr 0x007f0000001000\n" +
		" remote address: LID 0000 QPN 0x0012 PSN 0x000100 RKey 0x000077 VAddr 0x00000000007000\n"
	mk, _, _ := perfDataCheck("write-bw", false)
	check, err := perfCMData(mk)(hostOut)
	if err != nil {
		t.Fatal(err)
	}
	st, err := analyzeWith(bytes.NewReader(pcapOf(t, frames...)), check)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bad != 0 || st.BadICRC != 0 {
		t.Fatalf("bad %d icrc %d: %q", st.Bad, st.BadICRC, st.Lines)
	}
	if want := [][2]uint32{{0x12, 0x11}, {0x11, 0x12}}; !slices.Equal(st.CMPairs, want) {
		t.Errorf("pairs %#x, want %#x", st.CMPairs, want)
	}
	if st.RetransFromHost != 1 || st.RetransFromVM != 0 || !strings.Contains(st.RetransLines[0], "RC_RDMA_WRITE_ONLY psn=0x000011") {
		t.Errorf("resends host %d vm %d %q", st.RetransFromHost, st.RetransFromVM, st.RetransLines)
	}
	// The WRITEs pass; the SENDs of the exchange (not the pattern) and
	// the MADs are not the test connection's, and not judged.
	if st.DataBad != 0 {
		t.Errorf("data checked %d bad %d %q", st.DataChecked, st.DataBad, st.DataLines)
	}
	want := map[string]int{"host REQ": 3, "vm REP": 2, "host RTU": 2, "vm REJ": 1, "vm REJ invalid service ID": 1,
		"host DREQ": 2, "vm DREP": 2}
	if fmt.Sprint(st.CM) != fmt.Sprint(want) {
		t.Errorf("CM %v, want %v", st.CM, want)
	}
	if p := checkPerfCMCapture(st, hostOut, "write-bw", false); len(p) != 0 {
		t.Errorf("checkPerfCMCapture: %q", p)
	}
	// As a server, rocev2d would be refused by no one: the REJ is wrong,
	// and so are the roles.
	if p := checkPerfCMCapture(st, hostOut, "write-bw", true); len(p) == 0 {
		t.Error("checkPerfCMCapture accepted rocev2d's REQs as the server's")
	}
	// A MAD that does not decode is malformed.
	junk := frame(t, false, packet.Fields{BTH: bth.Fields{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1},
		DETH: deth.Fields{QKey: 0x80010000, SrcQP: 1}, Payload: make([]byte, 256)})
	st, err = analyzeWith(bytes.NewReader(pcapOf(t, junk)), nil)
	if err != nil || st.Bad != 1 || !strings.Contains(strings.Join(st.Lines, "\n"), "CM MAD") {
		t.Errorf("junk MAD: %v bad %d %q", err, st.Bad, st.Lines)
	}
}

func TestPerfQPNs(t *testing.T) {
	l, r, err := perfQPNs(" local address: LID 0000 QPN 0x0011 PSN 0x1\n remote address: LID 0000 QPN 000000 PSN 0x2\n")
	if err != nil || l != 0x11 || r != 0 {
		t.Errorf("%#x %#x %v", l, r, err)
	}
	if _, _, err := perfQPNs("nothing"); err == nil {
		t.Error("no address lines accepted")
	}
}
