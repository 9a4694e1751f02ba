package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// FuzzManager feeds arbitrary MADs (seeded with a valid REQ, REP, DREQ and
// SIDR_REQ) to a device whose CM listens on port 7174 and serves a UD
// port: the manager must never panic, and what it holds stays bounded.
func FuzzManager(f *testing.F) {
	seed := func(m cm.Message) {
		b := make([]byte, cm.MADSize)
		h := cm.NewHeader(0, 1)
		if err := cm.Encode(b, &h, m); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	req := &cm.REQFields{LocalCommID: 5, ServiceID: cm.ServiceID(cm.PSTCP, 7174), LocalQPN: 0x20, PathMTU: cm.MTU(transport.MTU1024),
		TransportServiceType: cm.TransportRC, RemoteCMResponseTimeout: 1, MaxCMRetries: 1}
	hdr := cm.CMAHeaderFields{SrcPort: 1, Src: addrA, Dst: addrB}
	cm.CMAHeader(req.PrivateData[:cm.CMAHeaderSize]).Encode(&hdr)
	seed(req)
	seed(&cm.REPFields{LocalCommID: 6, RemoteCommID: 5})
	seed(&cm.DREQFields{LocalCommID: 6, RemoteCommID: 5})
	sidr := &cm.SIDRREQFields{RequestID: 9, ServiceID: cm.ServiceID(cm.PSUDP, 7174)}
	cm.CMAHeader(sidr.PrivateData[:cm.CMAHeaderSize]).Encode(&hdr)
	seed(sidr)

	n := memnet.NewMemNetwork(memnet.Faults{})
	l, _ := n.Link(addrB)
	dev, err := transport.NewDevice(l, transport.DeviceConfig{})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	lst, err := Listen(dev, 7174, &ListenOptions{Backlog: 8, Options: Options{ResponseTimeout: time.Millisecond, MaxRetries: 1}})
	if err != nil {
		f.Fatal(err)
	}
	defer lst.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(4)
	qp, _ := dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeUD, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
	qp.ReadyUD(UDPQKey, 0)
	if _, err := ListenUD(dev, 7174, qp, UDPQKey, nil); err != nil {
		f.Fatal(err)
	}
	m, _ := managerFor(dev)
	src := netip.MustParseAddr("192.0.2.1")
	f.Fuzz(func(t *testing.T, mad []byte) {
		if len(mad) != cm.MADSize {
			return
		}
		var pf packet.Fields
		pf.BTH.Opcode = bth.UDSendOnly
		pf.BTH.PKey = bth.DefaultPKey
		pf.BTH.DestQP = 1
		pf.DETH.QKey = cm.QP1QKey
		pf.DETH.SrcQP = 1
		pf.Payload = mad
		buf := make([]byte, udp.MaxPacketSize)
		k, err := packet.Build(buf, &pf)
		if err != nil {
			t.Fatal(err)
		}
		dev.HandlePacket(buf[:k], src)
		m.mu.Lock()
		held, byQPN, remote, tw, gaveUp, shed := len(m.conns), len(m.byQPN), len(m.remote), m.timeWait, len(m.gaveUp), len(m.shedIDs)
		m.mu.Unlock()
		if held > 64 || byQPN > held || remote > held || tw > held || tw < 0 || gaveUp > 256 || shed > 1024 {
			t.Fatalf("the manager holds %d connections (%d by QPN, %d by remote ID, %d in TimeWait), %d given-up and %d shed IDs",
				held, byQPN, remote, tw, gaveUp, shed)
		}
	})
}
