// Package conformance checks the transport's responder against Linux rxe:
// for each golden capture it configures a responder QP with the QPN, PSN,
// rkey and vaddr of the capture, feeds it rxe's request packets and
// compares its responses with the responses rxe sent in the same capture,
// byte for byte (BTH .. payload; the ICRC depends on the IP header and is
// checked by the udp and icrc packages).
//
// Tests only, on top: it drives transport through a recording udp.Link
// with the packets test/golden reads. Nothing imports it.
package conformance

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/rocelayer"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
)

// recLink is a udp.Link that records what is sent and never receives.
type recLink struct {
	addr netip.Addr
	mu   sync.Mutex
	sent []udp.Packet
	done chan struct{}
	once sync.Once
}

func newRecLink(a netip.Addr) *recLink { return &recLink{addr: a, done: make(chan struct{})} }

func (l *recLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pkts {
		p.Buf = bytes.Clone(p.Buf)
		l.sent = append(l.sent, p)
	}
	return nil
}

func (l *recLink) take() []udp.Packet {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.sent
	l.sent = nil
	return s
}

func (l *recLink) Recv(pkts []udp.Packet) (int, error) {
	<-l.done
	return 0, net.ErrClosed
}
func (l *recLink) LocalAddr() netip.Addr { return l.addr }
func (l *recLink) BatchSize() int        { return 1 }
func (l *recLink) Stats() udp.Stats      { return udp.Stats{} }
func (l *recLink) Close() error          { l.once.Do(func() { close(l.done) }); return nil }

var _ udp.Link = (*recLink)(nil)

// frame is one RoCEv2 packet of a capture.
type frame struct {
	num      int
	src, dst netip.Addr
	sport    uint16
	payload  []byte // UDP payload: BTH .. ICRC
	pk       packet.Packet
}

func load(t *testing.T, path string) []*frame {
	t.Helper()
	frames, lt, err := golden.ReadPCAP(path)
	if err != nil {
		t.Fatal(err)
	}
	if lt != rocelayer.LinkTypeEthernet {
		t.Fatalf("%s: link type %v", path, lt)
	}
	var out []*frame
	for _, f := range frames {
		gp := gopacket.NewPacket(f.Data, layers.LayerTypeEthernet, gopacket.Default)
		u, _ := gp.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if u == nil || u.DstPort != udp.Port {
			continue
		}
		fr := &frame{num: f.Num, sport: uint16(u.SrcPort), payload: bytes.Clone(u.Payload)}
		s, d := gp.NetworkLayer().NetworkFlow().Endpoints()
		fr.src, _ = netip.AddrFromSlice(s.Raw())
		fr.dst, _ = netip.AddrFromSlice(d.Raw())
		if err := fr.pk.Parse(fr.payload); err != nil {
			t.Fatalf("frame %d: %v", f.Num, err)
		}
		out = append(out, fr)
	}
	return out
}

var captures = []string{
	"rc_write_64", "rc_write_4096", "rc_write_imm_64", "rc_write_imm_3000",
	"rc_read_64", "rc_read_4096",
	"rc_atomic_fadd", "rc_atomic_cswap",
	"rc_send_64", "rc_send_4096", "rc_send_bw_64", "rc_send_imm_62",
}

func TestResponderMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	for _, name := range captures {
		t.Run(name, func(t *testing.T) {
			frames := load(t, filepath.Join(dir, name+".pcap"))
			capt, err := golden.ParseTxt(filepath.Join(dir, name+".txt"))
			if err != nil {
				t.Fatal(err)
			}
			hosts := map[netip.Addr]bool{}
			for _, f := range frames {
				if f.pk.Info.Request && f.pk.Info.Transport == bth.TransportRC {
					hosts[f.dst] = true
				}
			}
			if len(hosts) == 0 {
				t.Fatal("no RC requests in capture")
			}
			for h := range hosts {
				t.Run("responder="+h.String(), func(t *testing.T) { checkResponder(t, frames, capt, h) })
			}
		})
	}
}

// checkResponder plays host h's responder.
func checkResponder(t *testing.T, frames []*frame, capt *golden.Capture, h netip.Addr) {
	var reqs, resps []*frame
	var peer netip.Addr
	for _, f := range frames {
		if f.pk.Info.Transport != bth.TransportRC {
			continue
		}
		if f.pk.Info.Request && f.dst == h {
			reqs = append(reqs, f)
			peer = f.src
		}
		if !f.pk.Info.Request && f.src == h {
			resps = append(resps, f)
		}
	}
	if len(resps) == 0 {
		t.Fatal("rxe sent no responses")
	}
	localQPN := reqs[0].pk.BTH.DestQP()
	peerQPN := resps[0].pk.BTH.DestQP()
	rqPSN := uint32(reqs[0].pk.BTH.PSN())

	// Memory: the region the requests address; iova = the VAddr the tool
	// printed for h when it printed one.
	var lo, hi uint64 = ^uint64(0), 0
	var rkey uint32
	for _, f := range reqs {
		var va, n uint64
		switch {
		case f.pk.RETH != nil:
			va, n, rkey = f.pk.RETH.VA(), uint64(f.pk.RETH.DMALength()), f.pk.RETH.RKey()
		case f.pk.AtomicETH != nil:
			va, n, rkey = f.pk.AtomicETH.VA(), 8, f.pk.AtomicETH.RKey()
		default:
			continue
		}
		lo, hi = min(lo, va), max(hi, va+n)
	}
	for _, a := range capt.Addrs {
		if a.Host == h && a.HasRKey && a.QPN == localQPN {
			if a.RKey != rkey && rkey != 0 {
				t.Fatalf("requests use rkey %#x, tool printed %#x", rkey, a.RKey)
			}
			if a.VAddr <= lo {
				lo = a.VAddr
			}
		}
	}
	link := newRecLink(h)
	dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	var mem []byte
	var mr *memreg.MR
	if hi > lo {
		mem = make([]byte, hi-lo)
		mr, err = pd.RegisterMRIOVA(mem, lo, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
		if err != nil {
			t.Fatal(err)
		}
	}
	rbuf := make([]byte, 1<<16)
	rmr, err := pd.RegisterMR(rbuf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := dev.CreateCQ(1024)
	// QPNs are handed out in order from 0x11 (as rxe does); create QPs up
	// to the one the capture used.
	var qp *transport.QP
	for i := 0; i < 64 && (qp == nil || qp.QPN() != localQPN); i++ {
		qp, err = dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 256})
		if err != nil {
			t.Fatal(err)
		}
	}
	if qp.QPN() != localQPN {
		t.Fatalf("could not get QPN %#x", localQPN)
	}
	if err := qp.Connect(transport.ConnParams{Peer: peer, DestQPN: peerQPN, RQPSN: rqPSN, SQPSN: 0,
		PathMTU: transport.MTU1024, Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic,
		MaxRdAtomic: 16, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 64; i++ {
		if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{{Addr: rmr.IOVA(), Length: uint32(len(rbuf)), LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}

	// Feed the requests in capture order. Before a READ or an atomic, load
	// the memory with what rxe returned for it, so that the data and the
	// original value must come out the same way.
	var got []udp.Packet
	for _, f := range reqs {
		switch f.pk.Info.Kind {
		case bth.KindReadRequest:
			va := f.pk.RETH.VA()
			n := int(f.pk.RETH.DMALength())
			var data []byte
			for _, r := range resps {
				if r.pk.Info.Kind == bth.KindReadResponse && r.pk.BTH.PSN().Diff(f.pk.BTH.PSN()) >= 0 &&
					int(r.pk.BTH.PSN().Diff(f.pk.BTH.PSN())) < (n+1023)/1024 {
					data = append(data, r.pk.Payload...)
				}
			}
			if len(data) != n {
				t.Fatalf("frame %d: rxe returned %d bytes for a %d-byte READ", f.num, len(data), n)
			}
			copy(mem[va-lo:], data)
		case bth.KindFetchAdd, bth.KindCompareSwap:
			va := f.pk.AtomicETH.VA()
			for _, r := range resps {
				if r.pk.Info.Kind == bth.KindAtomicAck && r.pk.BTH.PSN() == f.pk.BTH.PSN() {
					binary.NativeEndian.PutUint64(mem[va-lo:], r.pk.AtomicAck.OrigData())
				}
			}
		}
		in := bytes.Clone(f.payload)
		var p packet.Packet
		if err := p.Parse(in); err != nil {
			t.Fatal(err)
		}
		// memreg chooses its own keys: map rxe's rkey onto ours.
		if p.RETH != nil && mr != nil {
			p.RETH.SetRKey(mr.RKey())
		}
		if p.AtomicETH != nil && mr != nil {
			p.AtomicETH.SetRKey(mr.RKey())
		}
		if err := dev.HandlePacket(in, f.src); err != nil {
			t.Fatalf("frame %d: %v", f.num, err)
		}
		got = append(got, link.take()...)
		// Check the effect of atomics on memory.
		if f.pk.Info.Kind == bth.KindFetchAdd {
			va := f.pk.AtomicETH.VA()
			want := uint64(0)
			for _, r := range resps {
				if r.pk.Info.Kind == bth.KindAtomicAck && r.pk.BTH.PSN() == f.pk.BTH.PSN() {
					want = r.pk.AtomicAck.OrigData() + f.pk.AtomicETH.SwapAdd()
				}
			}
			if v := binary.NativeEndian.Uint64(mem[va-lo:]); v != want {
				t.Errorf("frame %d: memory after FETCH_ADD %#x, want %#x", f.num, v, want)
			}
		}
	}
	if len(got) != len(resps) {
		for _, g := range got {
			var p packet.Packet
			_ = p.Parse(g.Buf)
			t.Logf("ours: %v psn=%v", p.Info, p.BTH.PSN())
		}
		t.Fatalf("%d responses, rxe sent %d", len(got), len(resps))
	}
	for i, r := range resps {
		g := got[i]
		var p packet.Packet
		if err := p.Parse(g.Buf); err != nil {
			t.Fatalf("response %d: %v", i, err)
		}
		where := fmt.Sprintf("response %d (rxe frame %d, %v)", i, r.num, r.pk.BTH.Opcode())
		if p.BTH.Opcode() != r.pk.BTH.Opcode() || p.BTH.PSN() != r.pk.BTH.PSN() || p.BTH.DestQP() != r.pk.BTH.DestQP() {
			t.Errorf("%s: ours %v psn %v dqpn %#x", where, p.BTH.Opcode(), p.BTH.PSN(), p.BTH.DestQP())
		}
		if (p.AETH == nil) != (r.pk.AETH == nil) || p.AETH != nil && (p.AETH.Syndrome() != r.pk.AETH.Syndrome() || p.AETH.MSN() != r.pk.AETH.MSN()) {
			t.Errorf("%s: AETH ours %v, rxe %v", where, aethStr(&p), aethStr(&r.pk))
		}
		if r.pk.AtomicAck != nil && (p.AtomicAck == nil || p.AtomicAck.OrigData() != r.pk.AtomicAck.OrigData()) {
			t.Errorf("%s: atomic orig differs", where)
		}
		if !bytes.Equal(p.Payload, r.pk.Payload) {
			t.Errorf("%s: payload differs", where)
		}
		// Byte-exact: everything but the ICRC trailer.
		if !bytes.Equal(g.Buf[:len(g.Buf)-4], r.payload[:len(r.payload)-4]) {
			t.Errorf("%s: bytes differ\nours % x\nrxe  % x", where, g.Buf[:min(len(g.Buf)-4, 48)], r.payload[:min(len(r.payload)-4, 48)])
		}
		if g.SrcPort != r.sport {
			t.Errorf("%s: UDP source port ours %d, rxe %d", where, g.SrcPort, r.sport)
		}
		if g.Addr != r.dst {
			t.Errorf("%s: sent to %v, rxe to %v", where, g.Addr, r.dst)
		}
	}
	// Receive completions match what the requests carried.
	var wc [64]transport.WC
	n := cq.Poll(wc[:])
	k := 0
	for _, f := range reqs {
		pos := f.pk.Info.Pos
		if (f.pk.Info.Kind == bth.KindSend || f.pk.Info.Imm) && (pos == bth.PosLast || pos == bth.PosOnly) {
			if k >= n {
				t.Fatalf("missing receive completion for frame %d", f.num)
			}
			c := wc[k]
			k++
			if c.Status != transport.WCSuccess {
				t.Errorf("frame %d: receive completion %+v", f.num, c)
			}
			if f.pk.Info.Imm && (c.Flags&transport.WCWithImm == 0 || c.Imm != f.pk.ImmDt.Imm()) {
				t.Errorf("frame %d: receive completion %+v, imm %#x", f.num, c, f.pk.ImmDt.Imm())
			}
		}
	}
	if k != n {
		t.Errorf("%d receive completions, want %d", n, k)
	}
	t.Logf("%d requests from %v -> %d responses match rxe byte for byte (QPN %#x, rq_psn %#x, %d bytes of memory)", len(reqs), peer, len(resps), localQPN, rqPSN, len(mem))
}

func aethStr(p *packet.Packet) string {
	if p.AETH == nil {
		return "none"
	}
	return fmt.Sprintf("%v msn=%d", p.AETH.Syndrome(), p.AETH.MSN())
}
