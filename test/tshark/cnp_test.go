package tshark

import (
	"bytes"
	"context"
	"net"
	"sync"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestTsharkDecodesTransportCNP runs an RC WRITE through an in-memory
// network that marks every ECN-capable packet CE, writes what crosses it
// to a pcap and has tshark decode the CNPs the notification point sent:
// opcode 129, the marked packet's sender's QPN, P_Key 0xffff, the IP DSCP 48,
// Not-ECT (this tshark has no BECN field: transport's TestCNPWire checks the bytes),
// and the data packets ECT(0); nothing malformed.
func TestTsharkDecodesTransportCNP(t *testing.T) {
	tshark := needTshark(t)
	file := filepath.Join(t.TempDir(), "cnp.pcap")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65536, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var werr error
	mem := memnet.NewMemNetwork(memnet.Faults{CEMark: 1, Seed: 9})
	mem.SetTap(func(src, dst netip.Addr, sport uint16, tos uint8, payload []byte) {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TOS: tos, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: src.AsSlice(), DstIP: dst.AsSlice(), Flags: layers.IPv4DontFragment}
		u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 4791}
		u.SetNetworkLayerForChecksum(ip)
		buf := gopacket.NewSerializeBuffer()
		err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, u, gopacket.Payload(payload))
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			err = w.WritePacket(gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: len(buf.Bytes()), Length: len(buf.Bytes())}, buf.Bytes())
		}
		if err != nil && werr == nil {
			werr = err
		}
	})
	addrA, addrB := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	type end struct {
		dev *transport.Device
		pd  *memreg.PD
		cq  *transport.CQ
		qp  *transport.QP
	}
	mk := func(a netip.Addr) *end {
		l, err := mem.Link(a)
		if err != nil {
			t.Fatal(err)
		}
		d, err := transport.NewDevice(l, transport.DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		pd, _ := d.AllocPD()
		cq, err := d.CreateCQ(64)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := d.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		return &end{d, pd, cq, qp}
	}
	a, b := mk(addrA), mk(addrB)
	retry := &transport.Retry{Timeout: 14, RetryCnt: 7, RNRRetry: 7}
	if err := a.qp.Connect(transport.ConnParams{Peer: addrB, DestQPN: b.qp.QPN(), SQPSN: 1, RQPSN: 2, PathMTU: transport.MTU1024, Retry: retry}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(transport.ConnParams{Peer: addrA, DestQPN: a.qp.QPN(), SQPSN: 2, RQPSN: 1, PathMTU: transport.MTU1024,
		Access: memreg.AccessRemoteWrite, Retry: retry}); err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 4096)
	dst := make([]byte, 4096)
	lmr, err := a.pd.RegisterMR(src, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	rmr, err := b.pd.RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(transport.SendWR{WRID: 1, Opcode: transport.WRWrite, Flags: transport.SendSignaled,
		SGEs: []memreg.SGE{lmr.SGE(0, 4096)}, RemoteAddr: rmr.IOVA(), RKey: rmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]transport.WC
	if _, err := a.cq.Wait(ctx, wc[:]); err != nil || wc[0].Status != transport.WCSuccess {
		t.Fatalf("WRITE: %v %v", err, wc[0].Status)
	}
	for i := 0; i < 1000 && a.dev.Counters().RPCNPHandled == 0; i++ {
		time.Sleep(time.Millisecond)
	}
	a.dev.Close()
	b.dev.Close()
	mu.Lock()
	if werr != nil {
		t.Fatal(werr)
	}
	mu.Unlock()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	out := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", file, "-n", "-T", "fields", "-E", "separator=/t",
		"-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp",
		"-e", "infiniband.bth.p_key", "-e", "ip.dsfield.dscp", "-e", "ip.dsfield.ecn", "-e", "ip.src")))
	cnps, data := 0, 0
	for _, line := range strings.Split(out, "\n") {
		v := strings.Split(line, "\t")
		if len(v) != 6 {
			t.Fatalf("tshark line %q", line)
		}
		if v[0] == "129" {
			cnps++
			qpn, _ := strconv.ParseUint(v[1], 0, 32)
			// A CNP goes to the QP of the peer whose packet was marked:
			// B answers A's WRITE, A answers B's ACK.
			want := a.qp.QPN()
			if v[5] == "192.0.2.1" {
				want = b.qp.QPN()
			}
			if uint32(qpn) != want || v[2] != "65535" || v[3] != "48" || v[4] != "0" {
				t.Errorf("CNP decoded as %q (want destqp %#x, P_Key 65535, DSCP 48, Not-ECT)", line, want)
			}
			continue
		}
		data++
		if v[4] != "2" {
			t.Errorf("packet %q is not ECT(0)", line)
		}
	}
	if cnps == 0 || data < 5 {
		t.Fatalf("tshark saw %d CNPs and %d other packets:\n%s", cnps, data, out)
	}
	if testing.Verbose() {
		t.Logf("tshark:\n%s", out)
	}
	bad := strings.TrimSpace(string(runCmd(t, "", tshark, "-r", file, "-n", "-Y", "_ws.malformed || _ws.expert.severity >= warning",
		"-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message")))
	if bad != "" && !bytes.Contains([]byte(bad), []byte("ICRC")) {
		t.Errorf("tshark reports malformed/expert packets:\n%s", bad)
	}
}
