//go:build linux

package interop

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
)

// frame6 builds an Ethernet/IPv6/UDP frame with a valid ICRC around f,
// from HostLL (fromHost) or VMLL, as each side sends it: the host with
// a flow label and a UDP checksum, rxe with flow label 0 and UDP
// checksum 0.
func frame6(t *testing.T, fromHost bool, f packet.Fields) []byte {
	t.Helper()
	bt := make([]byte, packet.Len(f.BTH.Opcode, len(f.Payload)))
	n, err := packet.Build(bt, &f)
	if err != nil {
		t.Fatal(err)
	}
	bt = bt[:n]
	ip := make([]byte, 40+8+len(bt))
	src, dst := netip.MustParseAddr(HostLL).As16(), netip.MustParseAddr(VMLL).As16()
	flow, csum := uint32(0x8a4b1), uint16(0x1234) // the checksum is not checked
	if !fromHost {
		src, dst, flow, csum = dst, src, 0, 0
	}
	binary.BigEndian.PutUint32(ip[0:], 6<<28|flow)
	binary.BigEndian.PutUint16(ip[4:], uint16(8+len(bt)))
	ip[6], ip[7] = 17, 64
	copy(ip[8:], src[:])
	copy(ip[24:], dst[:])
	binary.BigEndian.PutUint16(ip[40:], 0xc001)
	binary.BigEndian.PutUint16(ip[42:], 4791)
	binary.BigEndian.PutUint16(ip[44:], uint16(8+len(bt)))
	binary.BigEndian.PutUint16(ip[46:], csum)
	copy(ip[48:], bt)
	if err := icrc.Put(ip); err != nil {
		t.Fatal(err)
	}
	eth := make([]byte, 14, 14+len(ip))
	binary.BigEndian.PutUint16(eth[12:], 0x86dd)
	return append(eth, ip...)
}

// TestAnalyzeIPv6AndMTU: an IPv6 capture at path MTU 4096 — the host is
// told from the VM by HostLL, the IPv6 headers are summarised, a READ of
// 8192 bytes spans two response PSNs (so the next READ is no resend), its
// responses are placed at 4096-byte steps, and the payload sizes pass
// checkFamilyAndMTU; at the lab's default MTU 1024 the same capture has
// "resends" and misplaced data.
func TestAnalyzeIPv6AndMTU(t *testing.T) {
	const base = 0x10000
	data := make([]byte, 8192)
	for i := range data {
		data[i] = perfPattern(i)
	}
	read := func(psn uint32, va uint64) packet.Fields {
		return packet.Fields{BTH: bth.Fields{Opcode: bth.RCReadRequest, PKey: 0xffff, DestQP: 0x11, PSN: bth.PSN(psn)},
			RETH: reth.Fields{VA: va, DMALength: 8192}}
	}
	resp := func(psn uint32, op bth.Opcode, p []byte) packet.Fields {
		return packet.Fields{BTH: bth.Fields{Opcode: op, PKey: 0xffff, DestQP: 0x12, PSN: bth.PSN(psn)}, Payload: p}
	}
	frames := [][]byte{
		frame6(t, false, read(10, base)),
		frame6(t, true, resp(10, bth.RCReadResponseFirst, data[:4096])),
		frame6(t, true, resp(11, bth.RCReadResponseLast, data[4096:])),
		frame6(t, false, read(12, base)),
		frame6(t, true, resp(12, bth.RCReadResponseFirst, data[:4096])),
		frame6(t, true, resp(13, bth.RCReadResponseLast, data[4096:])),
	}
	check := func(p Payload) string { return patternAt(p.Data, int(p.VA-base)) }
	st, err := analyzeMTU(bytes.NewReader(pcapOf(t, frames...)), check, nil, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if st.RoCE != 6 || st.IPv6 != 6 || st.FromHost != 4 || st.FromVM != 2 || st.BadICRC != 0 || st.Bad != 0 {
		t.Fatalf("counts: %s", st)
	}
	if st.RetransFromVM != 0 || st.DataChecked != 4 || st.DataBad != 0 {
		t.Fatalf("resends %d, data checked %d bad %d %q", st.RetransFromVM, st.DataChecked, st.DataBad, st.DataLines)
	}
	if st.VMUDPCsumZero != 2 || st.HostUDPCsumZero != 0 || st.VMFlowLabels[0] != 2 || st.HostFlowLabels[0x8a4b1] != 4 ||
		st.VMTTLs[64] != 2 || st.HostTTLs[64] != 4 {
		t.Fatalf("IPv6 headers: %s", st.IPv6Summary())
	}
	if s := st.IPv6Summary(); !strings.Contains(s, "IPv6 6/6: rxe UDP csum 0 on 2/2, flow labels [0x0], hop limits [64]; rocev2d UDP csum 0 on 0/4, flow labels [0x8a4b1]") {
		t.Errorf("summary %q", s)
	}
	if st.HostMaxPayload != 4096 || st.HostMiddlePayloads[4096] != 2 || st.VMMaxPayload != 0 {
		t.Errorf("payloads: host max %d first/middle %v, vm max %d", st.HostMaxPayload, st.HostMiddlePayloads, st.VMMaxPayload)
	}
	if p := checkFamilyAndMTU(st, true, 8192, 4096); len(p) != 0 {
		t.Errorf("checkFamilyAndMTU: %q", p)
	}
	if p := checkFamilyAndMTU(st, false, 8192, 4096); len(p) != 1 || !strings.Contains(p[0], "6 RoCEv2 packets were IPv6, want none") {
		t.Errorf("IPv4 cell on an IPv6 capture: %q", p)
	}
	if p := checkFamilyAndMTU(st, true, 8192, 2048); len(p) != 2 || !strings.Contains(p[0], "rocev2d sent a 4096-byte payload, beyond the path MTU 2048") ||
		!strings.Contains(p[1], "FIRST/MIDDLE packets of [4096] bytes, want exactly the path MTU 2048") {
		t.Errorf("path MTU 2048: %q", p)
	}

	// At MTU 1024 the READ would span 8 PSNs: the second READ looks
	// like a resend, and the second response is placed 1024 bytes in.
	st, err = analyzeMTU(bytes.NewReader(pcapOf(t, frames...)), check, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.RetransFromVM != 1 || st.DataBad == 0 {
		t.Errorf("at MTU 1024: resends %d, data bad %d", st.RetransFromVM, st.DataBad)
	}
}

func TestRxeActiveMTU(t *testing.T) {
	for _, c := range []struct{ netdev, ib int }{{1500, 1024}, {9000, 4096}, {4176, 4096}, {4175, 2048}, {1104, 1024}, {1103, 512}, {576, 256}} {
		if got := rxeActiveMTU(c.netdev); got != c.ib {
			t.Errorf("rxeActiveMTU(%d) = %d, want %d", c.netdev, got, c.ib)
		}
	}
}
