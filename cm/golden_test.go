package cm_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/test/goldendir"
)

// roce is one RoCEv2 packet of a golden capture.
type roce struct {
	file    string // base name of the capture
	frame   int    // 1-based frame number
	src     netip.Addr
	dst     netip.Addr
	srcPort uint16
	srcMAC  net.HardwareAddr
	pk      packet.Packet // views alias raw
	raw     []byte
}

// readCapture returns every RoCEv2 packet (UDP destination port 4791) of
// the pcap at path, parsed.
func readCapture(tb testing.TB, path string) []roce {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(bufio.NewReader(f))
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	var out []roce
	for frame := 1; frame < 100_000; frame++ {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			tb.Fatalf("%s frame %d: %v", path, frame, err)
		}
		gp := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		udp, _ := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || udp.DstPort != 4791 || gp.NetworkLayer() == nil {
			continue
		}
		s, d := gp.NetworkLayer().NetworkFlow().Endpoints()
		p := roce{file: filepath.Base(path), frame: frame, srcPort: uint16(udp.SrcPort)}
		p.src, _ = netip.AddrFromSlice(s.Raw())
		p.dst, _ = netip.AddrFromSlice(d.Raw())
		if eth, _ := gp.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); eth != nil {
			p.srcMAC = eth.SrcMAC
		}
		p.raw = append([]byte(nil), udp.Payload...)
		if err := p.pk.Parse(p.raw); err != nil {
			tb.Fatalf("%s frame %d: %v", path, frame, err)
		}
		out = append(out, p)
	}
	return out
}

// madCaptures are the golden captures that may hold CM MADs.
var madCaptures = []string{"rdmacm_rping.pcap", "host_ud_interop.pcap", "ud_send_512.pcap"}

// isMAD reports whether p is a UD SEND to QP1 with QP1's Q_Key: a MAD.
func isMAD(p *roce) bool {
	return p.pk.DETH != nil && p.pk.BTH.DestQP() == 1 && p.pk.DETH.QKey() == 0x80010000
}

// goldenMAD is one CM MAD of a golden capture.
type goldenMAD struct {
	roce
	mad []byte // the UD payload, 256 bytes
}

// goldenMADs returns every MAD (UD SEND to QP1 with QP1's Q_Key) of the
// captures in madCaptures that exist in dir, and every RoCEv2 packet of
// rdmacm_rping.pcap.
func goldenMADs(tb testing.TB, dir string) (mads []goldenMAD, rping []roce) {
	tb.Helper()
	for _, name := range madCaptures {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		pkts := readCapture(tb, path)
		if name == "rdmacm_rping.pcap" {
			rping = pkts
		}
		for _, p := range pkts {
			if isMAD(&p) {
				mads = append(mads, goldenMAD{roce: p, mad: p.pk.Payload})
			}
		}
	}
	return mads, rping
}

// TestGoldenMADs decodes every CM MAD of the golden captures (the five of
// rdmacm_rping.pcap: rping's REQ, REP, RTU, DREQ, DREP between rxe on
// 192.0.2.3, the client, and 192.0.2.2, the server), checks the values
// against what the capture shows elsewhere (the RC packets' QPNs, PSNs,
// P_Key and UDP source port, the IP addresses and MACs, rping's default
// port 7174), and re-encodes each from its decoded fields byte for byte.
func TestGoldenMADs(t *testing.T) {
	dir := goldendir.Require(t)
	if _, err := os.Stat(filepath.Join(dir, "rdmacm_rping.pcap")); err != nil {
		t.Fatalf("the golden directory has no rdmacm_rping.pcap: %v", err)
	}
	mads, rping := goldenMADs(t, dir)
	client, server := netip.MustParseAddr("192.0.2.3"), netip.MustParseAddr("192.0.2.2")

	type want struct {
		attr     cm.AttrID
		src, dst netip.Addr
	}
	seq := []want{
		{cm.AttrREQ, client, server},
		{cm.AttrREP, server, client},
		{cm.AttrRTU, client, server},
		{cm.AttrDREQ, client, server},
		{cm.AttrDREP, server, client},
	}
	if len(mads) != len(seq) {
		t.Fatalf("%d MADs in the golden captures, want the %d of rdmacm_rping.pcap", len(mads), len(seq))
	}
	msgs := map[cm.AttrID]cm.Message{}
	for i, g := range mads {
		where := fmt.Sprintf("%s #%d", g.file, g.frame)
		if g.file != "rdmacm_rping.pcap" {
			t.Errorf("%s: a MAD outside rdmacm_rping.pcap", where)
		}
		if len(g.mad) != cm.MADSize {
			t.Fatalf("%s: MAD of %d bytes", where, len(g.mad))
		}
		if g.pk.DETH.SrcQP() != cm.QP1 || g.pk.DETH.QKey() != cm.QP1QKey {
			t.Errorf("%s: DETH srcqp %#x qkey %#x, want QP1 and its Q_Key", where, g.pk.DETH.SrcQP(), g.pk.DETH.QKey())
		}
		h, m, err := cm.Decode(g.mad)
		if err != nil {
			t.Fatalf("%s: Decode: %v", where, err)
		}
		w := seq[i]
		if h.AttributeID != w.attr || g.src != w.src || g.dst != w.dst {
			t.Errorf("%s: %v %v -> %v, want %v %v -> %v", where, h.AttributeID, g.src, g.dst, w.attr, w.src, w.dst)
		}
		// Linux's CM: one transaction ID (hi_tid 2 above the active side's
		// comm ID, as a little-endian host stores it) for every MAD of the
		// connection; method Send, status 0, attribute modifier 0.
		wantH := cm.NewHeader(w.attr, 0x0000000287996624)
		if h != wantH {
			t.Errorf("%s: header %+v, want %+v", where, h, wantH)
		}
		if m.AttributeID() != h.AttributeID {
			t.Errorf("%s: message %T for attribute %v", where, m, h.AttributeID)
		}
		// Byte for byte from the decoded fields, through both Encode paths.
		out := bytes.Repeat([]byte{0xa5}, cm.MADSize)
		if err := cm.Encode(out, &h, m); err != nil {
			t.Fatalf("%s: Encode: %v", where, err)
		}
		if !bytes.Equal(out, g.mad) {
			t.Errorf("%s: Encode(Decode(mad))\n got %x\nwant %x", where, out, g.mad)
		}
		msgs[h.AttributeID] = m
	}
	req := msgs[cm.AttrREQ].(*cm.REQFields)
	rep := msgs[cm.AttrREP].(*cm.REPFields)
	rtu := msgs[cm.AttrRTU].(*cm.RTUFields)
	dreq := msgs[cm.AttrDREQ].(*cm.DREQFields)
	drep := msgs[cm.AttrDREP].(*cm.DREPFields)

	// The RC traffic that follows the handshake.
	var fromClient, fromServer []*roce
	for i := range rping {
		p := &rping[i]
		if p.pk.Info.Transport != bth.TransportRC {
			continue
		}
		if p.src == client {
			fromClient = append(fromClient, p)
		} else {
			fromServer = append(fromServer, p)
		}
	}
	if len(fromClient) == 0 || len(fromServer) == 0 {
		t.Fatalf("no RC packets in rdmacm_rping.pcap (%d from the client, %d from the server)", len(fromClient), len(fromServer))
	}
	firstRequest := func(ps []*roce) uint32 {
		for _, p := range ps {
			if p.pk.Info.Request {
				return uint32(p.pk.BTH.PSN())
			}
		}
		t.Fatal("no RC request")
		return 0
	}
	eq := func(what string, got, want any) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	for _, p := range fromServer {
		eq(fmt.Sprintf("#%d server->client RC dest QPN (REQ local QPN)", p.frame), p.pk.BTH.DestQP(), req.LocalQPN)
		eq(fmt.Sprintf("#%d P_Key (REQ P_Key)", p.frame), p.pk.BTH.PKey(), req.PKey)
	}
	for _, p := range fromClient {
		eq(fmt.Sprintf("#%d client->server RC dest QPN (REP local QPN)", p.frame), p.pk.BTH.DestQP(), rep.LocalQPN)
	}
	// A REQ's starting PSN is where the passive side's sends start, a
	// REP's where the active side's do.
	eq("server's first RC request PSN (REQ starting PSN)", firstRequest(fromServer), req.StartingPSN)
	eq("client's first RC request PSN (REP starting PSN)", firstRequest(fromClient), rep.StartingPSN)
	// rxe derives both ends' UDP source port from the REQ's primary flow
	// label (rdma_flow_label_to_udp_sport).
	fl := req.Primary.FlowLabel
	sport := uint16(fl&0x3fff^(fl&0xfc000)>>14) | 0xc000
	for _, p := range append(fromClient, fromServer...) {
		eq(fmt.Sprintf("#%d RC UDP source port (from the REQ flow label %#x)", p.frame, fl), p.srcPort, sport)
	}
	// The MADs themselves: rxe sends QP1's datagrams from the UDP port of
	// its per-QP hash (0xc000 | hash_32(1) >> 18: 55410) with AckReq set,
	// P_Key 0xffff, and PSNs counting from 0 per sender.
	nextPSN := map[netip.Addr]uint32{}
	for _, g := range mads {
		qp1Port := uint16(0xc000 | (uint32(1)*0x61c88647)>>18&0x3fff)
		eq(fmt.Sprintf("#%d MAD UDP source port", g.frame), g.srcPort, qp1Port)
		eq(fmt.Sprintf("#%d MAD PSN", g.frame), uint32(g.pk.BTH.PSN()), nextPSN[g.src])
		eq(fmt.Sprintf("#%d MAD AckReq", g.frame), g.pk.BTH.AckReq(), true)
		eq(fmt.Sprintf("#%d MAD P_Key", g.frame), g.pk.BTH.PKey(), uint16(0xffff))
		nextPSN[g.src]++
	}
	// CA GUIDs are the EUI-64 of the senders' MACs.
	eq("REQ local CA GUID", req.LocalCAGUID, eui64(mads[0].srcMAC))
	eq("REP local CA GUID", rep.LocalCAGUID, eui64(mads[1].srcMAC))

	// Every REQ field, as Linux's CM and rdma_cm fill them for rping over
	// rxe on a 1500-byte netdev.
	wantREQ := cm.REQFields{
		LocalCommID:             0x24669987,
		ServiceID:               cm.ServiceID(cm.PSTCP, 7174),
		LocalCAGUID:             0x505400fffec00203,
		LocalQPN:                0x1f,
		ResponderResources:      1,
		InitiatorDepth:          1,
		RemoteCMResponseTimeout: 20,
		TransportServiceType:    cm.TransportRC,
		StartingPSN:             0xbf7118,
		LocalCMResponseTimeout:  20,
		RetryCount:              7,
		PKey:                    0xffff,
		PathMTU:                 cm.MTU1024,
		RNRRetryCount:           7,
		MaxCMRetries:            15,
		Primary: cm.Path{
			LocalLID:        cm.PermissiveLID,
			RemoteLID:       cm.PermissiveLID,
			LocalGID:        cm.GIDFromAddr(client),
			RemoteGID:       cm.GIDFromAddr(server),
			FlowLabel:       0x6979c,
			HopLimit:        64,
			LocalACKTimeout: 19,
		},
	}
	hdr := cm.CMAHeader(wantREQ.PrivateData[:])
	if err := hdr.Encode(&cm.CMAHeaderFields{SrcPort: 0xb9aa, Src: client, Dst: server}); err != nil {
		t.Fatal(err)
	}
	if *req != wantREQ {
		t.Errorf("REQ\n got %+v\nwant %+v", *req, wantREQ)
	}
	ps, port, ok := cm.SplitServiceID(req.ServiceID)
	eq("REQ service ID port space", ps, cm.PSTCP)
	eq("REQ service ID port (rping's default)", port, uint16(7174))
	eq("REQ service ID is rdma_cm's", ok && req.ServiceID&cm.CMAServiceIDMask == cm.CMAServiceIDBase, true)
	ch, err := cm.ParseCMAHeader(req.PrivateData[:])
	if err != nil {
		t.Fatalf("REQ cma_hdr: %v", err)
	}
	eq("cma_hdr", ch, cm.CMAHeaderFields{Version: cm.CMAVersion, SrcPort: 0xb9aa, Src: client, Dst: server})
	eq("REQ consumer private data after cma_hdr is zero", bytes.Count(req.PrivateData[cm.CMAHeaderSize:], []byte{0}), cm.CMAREQPrivateDataSize)
	eq("REQ path MTU in bytes (the .txt's path MTU)", req.PathMTU.Bytes(), 1024)

	wantREP := cm.REPFields{
		LocalCommID:        0xd5e039cb,
		RemoteCommID:       req.LocalCommID,
		LocalQPN:           0x20,
		StartingPSN:        0x7bb8a6,
		ResponderResources: 1,
		InitiatorDepth:     1,
		TargetACKDelay:     15,
		FailoverAccepted:   cm.FailoverAccepted,
		RNRRetryCount:      7,
		LocalCAGUID:        0x505400fffec00202,
	}
	if *rep != wantREP {
		t.Errorf("REP\n got %+v\nwant %+v", *rep, wantREP)
	}
	eq("RTU", *rtu, cm.RTUFields{LocalCommID: req.LocalCommID, RemoteCommID: rep.LocalCommID})
	eq("DREQ", *dreq, cm.DREQFields{LocalCommID: req.LocalCommID, RemoteCommID: rep.LocalCommID, RemoteQPN: rep.LocalQPN})
	eq("DREP", *drep, cm.DREPFields{LocalCommID: rep.LocalCommID, RemoteCommID: req.LocalCommID})
}

// eui64 returns the EUI-64 GUID of a MAC address (the universal/local bit
// flipped, ff:fe in the middle), as rxe makes its node GUID.
func eui64(mac net.HardwareAddr) uint64 {
	if len(mac) != 6 {
		return 0
	}
	return uint64(mac[0]^2)<<56 | uint64(mac[1])<<48 | uint64(mac[2])<<40 | 0xff<<32 | 0xfe<<24 |
		uint64(mac[3])<<16 | uint64(mac[4])<<8 | uint64(mac[5])
}
