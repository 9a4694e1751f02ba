package conformance

import (
	"context"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rdmacm"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// cmMADs returns the CM MADs of rdmacm_rping (REQ, REP, RTU, DREQ, DREP),
// decoded, with their frames.
func cmMADs(t *testing.T) (frames []*frame, hs []cm.HeaderFields, msgs []cm.Message) {
	t.Helper()
	for _, f := range load(t, filepath.Join(golden.Dir(t), "rdmacm_rping.pcap")) {
		if f.pk.BTH.DestQP() != 1 {
			continue
		}
		h, m, err := cm.Decode(f.pk.Payload)
		if err != nil {
			t.Fatalf("frame %d: %v", f.num, err)
		}
		frames, hs, msgs = append(frames, f), append(hs, h), append(msgs, m)
	}
	want := []cm.AttrID{cm.AttrREQ, cm.AttrREP, cm.AttrRTU, cm.AttrDREQ, cm.AttrDREP}
	if len(msgs) != len(want) {
		t.Fatalf("%d CM MADs, want %v", len(msgs), want)
	}
	for i, a := range want {
		if msgs[i].AttributeID() != a {
			t.Fatalf("MAD %d is %v, want %v", i, msgs[i].AttributeID(), a)
		}
	}
	return frames, hs, msgs
}

// madPacket builds the UD packet to QP1 carrying msg with header h.
func madPacket(t *testing.T, h cm.HeaderFields, msg cm.Message) []byte {
	t.Helper()
	mad := make([]byte, cm.MADSize)
	if err := cm.Encode(mad, &h, msg); err != nil {
		t.Fatal(err)
	}
	var f packet.Fields
	f.BTH.Opcode = bth.UDSendOnly
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = 1
	f.BTH.AckReq = true
	f.DETH.QKey = cm.QP1QKey
	f.DETH.SrcQP = 1
	f.Payload = mad
	buf := make([]byte, udp.MaxPacketSize)
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// sentMAD waits for the next MAD the device sends and decodes it.
func sentMAD(t *testing.T, l *recLink, what string) (netip.Addr, cm.HeaderFields, cm.Message) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range l.take() {
			var pk packet.Packet
			if pk.Parse(p.Buf) != nil || pk.BTH.DestQP() != 1 {
				continue
			}
			h, m, err := cm.Decode(pk.Payload)
			if err != nil {
				t.Fatalf("%s: our MAD does not decode: %v", what, err)
			}
			return p.Addr, h, m
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no %s sent", what)
	return netip.Addr{}, cm.HeaderFields{}, nil
}

// TestCMPassiveMatchesRxe plays rping's server: rxe's REQ (from the
// client's rping) goes in; our REP must carry what rxe's REP carried
// where the values are not ours to choose (transaction ID, remote comm
// ID, resources, ACK delay, retries), name our QP and PSN, and the
// connection must come up on rxe's RTU and go down on rxe's DREQ with a
// DREP like rxe's.
func TestCMPassiveMatchesRxe(t *testing.T) {
	frames, hs, msgs := cmMADs(t)
	req, rxeREP, rxeRTU, rxeDREQ, rxeDREP := msgs[0].(*cm.REQFields), msgs[1].(*cm.REPFields), msgs[2].(*cm.RTUFields),
		msgs[3].(*cm.DREQFields), msgs[4].(*cm.DREPFields)
	server, client := frames[0].dst, frames[0].src
	link := newRecLink(server)
	dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ps, port, _ := cm.SplitServiceID(req.ServiceID)
	if ps != cm.PSTCP || port != 7174 {
		t.Fatalf("rping's service ID %#x: port space %v port %d", req.ServiceID, ps, port)
	}
	l, err := rdmacm.Listen(dev, port, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := dev.HandlePacket(frames[0].payload, client); err != nil {
		t.Fatal(err)
	}
	r, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdr, _ := cm.ParseCMAHeader(req.PrivateData[:])
	if r.RemoteAddr() != netip.AddrPortFrom(client, hdr.SrcPort) {
		t.Errorf("request from %v, want %v:%d", r.RemoteAddr(), client, hdr.SrcPort)
	}
	type res struct {
		c   *rdmacm.Conn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := r.Accept(ctx, &rdmacm.Options{ResponderResources: 1, InitiatorDepth: 1})
		acc <- res{c, err}
	}()
	to, h, m := sentMAD(t, link, "REP")
	rep, ok := m.(*cm.REPFields)
	if !ok || to != client {
		t.Fatalf("sent %v to %v, want a REP to %v", m.AttributeID(), to, client)
	}
	if h.TransactionID != hs[1].TransactionID || h.Method != hs[1].Method {
		t.Errorf("REP header %+v, rxe's %+v", h, hs[1])
	}
	if rep.RemoteCommID != rxeREP.RemoteCommID || rep.ResponderResources != rxeREP.ResponderResources ||
		rep.InitiatorDepth != rxeREP.InitiatorDepth || rep.TargetACKDelay != rxeREP.TargetACKDelay ||
		rep.RNRRetryCount != rxeREP.RNRRetryCount || rep.FailoverAccepted != rxeREP.FailoverAccepted ||
		rep.EndToEndFlowControl != rxeREP.EndToEndFlowControl || rep.SRQ != rxeREP.SRQ || rep.LocalQKey != rxeREP.LocalQKey {
		t.Errorf("our REP %+v\nrxe's REP %+v", *rep, *rxeREP)
	}
	// Our REP names our QP, which is in RTR towards the client's QP and
	// sends from the REQ's starting PSN once established.
	var qpn uint32 = rep.LocalQPN
	// The RTU as rxe sent it, addressed to our comm ID.
	rtu := *rxeRTU
	rtu.RemoteCommID = rep.LocalCommID
	if err := dev.HandlePacket(madPacket(t, hs[2], &rtu), client); err != nil {
		t.Fatal(err)
	}
	a := <-acc
	if a.err != nil {
		t.Fatal(a.err)
	}
	attr, _ := a.c.QP().Query()
	if a.c.QP().QPN() != qpn || attr.State != transport.QPSRTS || attr.DestQPN != req.LocalQPN ||
		attr.SQPSN != req.StartingPSN || attr.RQPSN != rep.StartingPSN || attr.PathMTU != transport.MTU1024 {
		t.Errorf("QP after the RTU: %+v (REQ QPN %#x PSN %#x)", attr, req.LocalQPN, req.StartingPSN)
	}
	// rxe's DREQ, to our comm ID and QP.
	dreq := *rxeDREQ
	dreq.RemoteCommID, dreq.RemoteQPN = rep.LocalCommID, qpn
	if err := dev.HandlePacket(madPacket(t, hs[3], &dreq), client); err != nil {
		t.Fatal(err)
	}
	_, h, m = sentMAD(t, link, "DREP")
	drep, ok := m.(*cm.DREPFields)
	if !ok || drep.LocalCommID != rep.LocalCommID || drep.RemoteCommID != rxeDREP.RemoteCommID || h.TransactionID != hs[4].TransactionID {
		t.Errorf("our DREP %+v (%+v), rxe's %+v", m, h, *rxeDREP)
	}
	select {
	case <-a.c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("connection not ended by the DREQ")
	}
	a.c.Close()
}

// TestCMActiveMatchesRxe plays rping's client: our REQ must carry what
// rxe's did where the values are not ours to choose; rxe's REP brings the
// connection up (QP towards rxe's QP, sending from the REP's starting
// PSN) with an RTU like rxe's, and Close sends a DREQ like rxe's.
func TestCMActiveMatchesRxe(t *testing.T) {
	frames, hs, msgs := cmMADs(t)
	rxeREQ, rxeREP, rxeRTU, rxeDREQ := msgs[0].(*cm.REQFields), msgs[1].(*cm.REPFields), msgs[2].(*cm.RTUFields), msgs[3].(*cm.DREQFields)
	server, client := frames[0].dst, frames[0].src
	link := newRecLink(client)
	dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rxeHdr, _ := cm.ParseCMAHeader(rxeREQ.PrivateData[:])
	opts := &rdmacm.Options{ResponderResources: 1, InitiatorDepth: 1, LocalPort: rxeHdr.SrcPort}
	type res struct {
		c   *rdmacm.Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := rdmacm.Dial(ctx, dev, netip.AddrPortFrom(server, 7174), opts)
		dialed <- res{c, err}
	}()
	to, h, m := sentMAD(t, link, "REQ")
	req, ok := m.(*cm.REQFields)
	if !ok || to != server {
		t.Fatalf("sent %v to %v, want a REQ to %v", m.AttributeID(), to, server)
	}
	x, y := *req, *rxeREQ
	// What is ours to choose: IDs, QPN, PSN, GUID, timeouts, flow label.
	x.LocalCommID, x.LocalQPN, x.StartingPSN, x.LocalCAGUID = y.LocalCommID, y.LocalQPN, y.StartingPSN, y.LocalCAGUID
	x.RemoteCMResponseTimeout, x.LocalCMResponseTimeout = y.RemoteCMResponseTimeout, y.LocalCMResponseTimeout
	x.Primary.LocalACKTimeout, x.Primary.FlowLabel = y.Primary.LocalACKTimeout, y.Primary.FlowLabel
	if x != y {
		t.Errorf("our REQ differs from rxe's beyond what is ours to choose:\nours %+v\nrxe  %+v", x, y)
	}
	if h.Method != hs[0].Method || h.AttributeID != cm.AttrREQ {
		t.Errorf("REQ header %+v", h)
	}
	// rxe's REP, addressed to our REQ.
	rep := *rxeREP
	rep.RemoteCommID = req.LocalCommID
	hr := hs[1]
	hr.TransactionID = h.TransactionID
	if err := dev.HandlePacket(madPacket(t, hr, &rep), server); err != nil {
		t.Fatal(err)
	}
	d := <-dialed
	if d.err != nil {
		t.Fatal(d.err)
	}
	_, h2, m := sentMAD(t, link, "RTU")
	rtu, ok := m.(*cm.RTUFields)
	if !ok || rtu.LocalCommID != req.LocalCommID || rtu.RemoteCommID != rxeRTU.RemoteCommID || h2.TransactionID != h.TransactionID {
		t.Errorf("our RTU %+v, rxe's %+v", m, *rxeRTU)
	}
	attr, _ := d.c.QP().Query()
	if attr.State != transport.QPSRTS || attr.DestQPN != rxeREP.LocalQPN || attr.SQPSN != rxeREP.StartingPSN ||
		attr.RQPSN != req.StartingPSN || attr.MaxQPRdAtomic != 1 || attr.MaxDestRdAtomic != 1 {
		t.Errorf("QP after the REP: %+v", attr)
	}
	// Close: a DREQ like rxe's (to the server's QP), answered by rxe's DREP.
	closed := make(chan struct{})
	go func() { d.c.Close(); close(closed) }()
	_, _, m = sentMAD(t, link, "DREQ")
	dreq, ok := m.(*cm.DREQFields)
	if !ok || dreq.RemoteQPN != rxeDREQ.RemoteQPN || dreq.RemoteCommID != rxeDREQ.RemoteCommID || dreq.LocalCommID != req.LocalCommID {
		t.Errorf("our DREQ %+v, rxe's %+v", m, *rxeDREQ)
	}
	drep := msgs[4].(*cm.DREPFields)
	answer := *drep
	answer.RemoteCommID = req.LocalCommID
	if err := dev.HandlePacket(madPacket(t, hs[4], &answer), server); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return after the DREP")
	}
}
