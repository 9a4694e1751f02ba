package conformance

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
)

// gapResponder is a responder configured from a capture (as in
// checkResponder) that is fed rxe's requests one at a time.
type gapResponder struct {
	t           *testing.T
	dev         *transport.Device
	link        *recLink
	mem         []byte
	lo          uint64
	mr          *memreg.MR
	reqs, resps []*frame
	peer        netip.Addr
	localQPN    uint32
	peerQPN     uint32
	rqPSN       bth.PSN
	ackTemplate []byte // one of rxe's ACKNOWLEDGE packets (BTH .. ICRC)
	respForPSN  map[bth.PSN][]*frame
}

func newGapResponder(t *testing.T, frames []*frame) *gapResponder {
	g := &gapResponder{t: t, respForPSN: map[bth.PSN][]*frame{}}
	var h netip.Addr
	for _, f := range frames {
		if f.pk.Info.Transport == bth.TransportRC && f.pk.Info.Request {
			if !h.IsValid() {
				h, g.peer = f.dst, f.src
			}
			if f.dst != h {
				t.Skip("requests in both directions")
			}
			g.reqs = append(g.reqs, f)
		}
	}
	for _, f := range frames {
		if f.pk.Info.Transport == bth.TransportRC && !f.pk.Info.Request && f.src == h {
			g.resps = append(g.resps, f)
			g.respForPSN[f.pk.BTH.PSN()] = append(g.respForPSN[f.pk.BTH.PSN()], f)
			if f.pk.BTH.Opcode() == bth.RCAck && g.ackTemplate == nil {
				g.ackTemplate = bytes.Clone(f.payload)
			}
		}
	}
	g.localQPN, g.peerQPN = g.reqs[0].pk.BTH.DestQP(), g.resps[0].pk.BTH.DestQP()
	g.rqPSN = g.reqs[0].pk.BTH.PSN()
	var lo, hi uint64 = ^uint64(0), 0
	for _, f := range g.reqs {
		switch {
		case f.pk.RETH != nil:
			lo, hi = min(lo, f.pk.RETH.VA()), max(hi, f.pk.RETH.VA()+uint64(f.pk.RETH.DMALength()))
		case f.pk.AtomicETH != nil:
			lo, hi = min(lo, f.pk.AtomicETH.VA()), max(hi, f.pk.AtomicETH.VA()+8)
		}
	}
	g.link = newRecLink(h)
	var err error
	g.dev, err = transport.NewDevice(g.link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.dev.Close() })
	pd, _ := g.dev.AllocPD()
	if hi > lo {
		g.lo = lo
		g.mem = make([]byte, hi-lo)
		g.mr, err = pd.RegisterMRIOVA(g.mem, lo, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
		if err != nil {
			t.Fatal(err)
		}
	}
	rbuf := make([]byte, 1<<16)
	rmr, err := pd.RegisterMR(rbuf, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := g.dev.CreateCQ(1024)
	var qp *transport.QP
	for i := 0; i < 64 && (qp == nil || qp.QPN() != g.localQPN); i++ {
		if qp, err = g.dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 16, MaxRecvWR: 256}); err != nil {
			t.Fatal(err)
		}
	}
	if qp.QPN() != g.localQPN {
		t.Fatalf("could not get QPN %#x", g.localQPN)
	}
	if err := qp.Connect(transport.ConnParams{Peer: g.peer, DestQPN: g.peerQPN, RQPSN: uint32(g.rqPSN), SQPSN: 0,
		PathMTU: transport.MTU1024, Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic,
		MaxRdAtomic: 16, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 128; i++ {
		if err := qp.PostRecv(transport.RecvWR{WRID: uint64(i), SGEs: []memreg.SGE{{Addr: rmr.IOVA(), Length: uint32(len(rbuf)), LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

// feed hands request f to the responder (memory preloaded with what rxe
// returned for a READ or atomic) and returns what the responder sent.
func (g *gapResponder) feed(f *frame) [][]byte {
	g.t.Helper()
	switch f.pk.Info.Kind {
	case bth.KindReadRequest:
		va, n := f.pk.RETH.VA(), int(f.pk.RETH.DMALength())
		var data []byte
		for i := 0; i < max(1, (n+1023)/1024); i++ {
			for _, r := range g.respForPSN[f.pk.BTH.PSN().Add(i)] {
				if r.pk.Info.Kind == bth.KindReadResponse {
					data = append(data, r.pk.Payload...)
				}
			}
		}
		copy(g.mem[va-g.lo:], data)
	case bth.KindFetchAdd, bth.KindCompareSwap:
		for _, r := range g.respForPSN[f.pk.BTH.PSN()] {
			if r.pk.Info.Kind == bth.KindAtomicAck {
				binary.NativeEndian.PutUint64(g.mem[f.pk.AtomicETH.VA()-g.lo:], r.pk.AtomicAck.OrigData())
			}
		}
	}
	in := bytes.Clone(f.payload)
	var p packet.Packet
	if err := p.Parse(in); err != nil {
		g.t.Fatal(err)
	}
	if p.RETH != nil && g.mr != nil {
		p.RETH.SetRKey(g.mr.RKey())
	}
	if p.AtomicETH != nil && g.mr != nil {
		p.AtomicETH.SetRKey(g.mr.RKey())
	}
	if err := g.dev.HandlePacket(in, f.src); err != nil {
		g.t.Fatalf("frame %d: %v", f.num, err)
	}
	var out [][]byte
	for _, u := range g.link.take() {
		out = append(out, u.Buf)
	}
	return out
}

// rxeNAK builds the PSN sequence error NAK rxe sends (send_ack with
// AETH_NAK_PSN_SEQ_ERROR for the expected PSN and the current MSN) from one
// of its ACKs in the capture: same BTH flags, P_Key and destination QP.
func (g *gapResponder) rxeNAK(psn bth.PSN, msn uint32) []byte {
	if g.ackTemplate != nil {
		b := bytes.Clone(g.ackTemplate)
		var p packet.Packet
		if err := p.Parse(b); err != nil {
			g.t.Fatal(err)
		}
		p.BTH.SetPSN(psn)
		p.AETH.SetSyndrome(aeth.NAK(aeth.NAKPSNSeqError))
		p.AETH.SetMSN(msn)
		return b
	}
	// No plain ACK in the capture (READ/atomic only): take the BTH of
	// rxe's first response and make it an ACKNOWLEDGE.
	f := g.resps[0].pk.Fields()
	f = packet.Fields{BTH: f.BTH}
	f.BTH.Opcode = bth.RCAck
	f.BTH.PSN = psn
	f.AETH.Syndrome = aeth.NAK(aeth.NAKPSNSeqError)
	f.AETH.MSN = msn
	b := make([]byte, 64)
	n, err := packet.Build(b, &f)
	if err != nil {
		g.t.Fatal(err)
	}
	return b[:n]
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a[:len(a)-4], b[:len(b)-4]) }

// TestResponderGapMatchesRxe replays each one-directional capture with one
// request packet withheld: the responder answers the requests before the
// gap as rxe did, sends exactly one PSN sequence error NAK (byte-exact as
// rxe builds it: expected PSN, MSN of the messages completed so far) on the
// first request after the gap and nothing for the others, and when the
// requester goes back to the missing PSN it answers everything from there
// on byte for byte as rxe did.
func TestResponderGapMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	for _, name := range []string{"rc_write_4096", "rc_write_imm_3000", "rc_read_4096", "rc_atomic_fadd", "rc_send_bw_64", "rc_send_imm_62", "rc_write_64"} {
		t.Run(name, func(t *testing.T) {
			frames := load(t, filepath.Join(dir, name+".pcap"))
			for _, k := range []int{1, -1} { // the second request, and one in the middle
				g := newGapResponder(t, frames)
				if k < 0 {
					k = len(g.reqs) / 2
				}
				if k+2 > len(g.reqs) {
					t.Skipf("only %d requests", len(g.reqs))
				}
				t.Run(fmt.Sprintf("withhold-%d", k), func(t *testing.T) { checkGap(t, g, k) })
			}
		})
	}
}

func checkGap(t *testing.T, g *gapResponder, k int) {
	gap := g.reqs[k].pk.BTH.PSN()
	wantFor := func(reqs []*frame) [][]byte {
		var out [][]byte
		for _, r := range g.resps {
			for _, q := range reqs {
				if r.pk.BTH.PSN() == q.pk.BTH.PSN() ||
					(q.pk.Info.Kind == bth.KindReadRequest && r.pk.BTH.PSN().Diff(q.pk.BTH.PSN()) >= 0 &&
						int(r.pk.BTH.PSN().Diff(q.pk.BTH.PSN())) < max(1, (int(q.pk.RETH.DMALength())+1023)/1024)) {
					out = append(out, r.payload)
					break
				}
			}
		}
		return out
	}
	compare := func(phase string, got, want [][]byte) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d responses, rxe %d", phase, len(got), len(want))
		}
		for i := range got {
			if !sameBytes(got[i], want[i]) {
				t.Fatalf("%s: response %d differs\nours % x\nrxe  % x", phase, i, got[i][:min(len(got[i])-4, 32)], want[i][:min(len(want[i])-4, 32)])
			}
		}
	}
	// Before the gap: as rxe.
	var got [][]byte
	msn := uint32(0)
	for _, f := range g.reqs[:k] {
		got = append(got, g.feed(f)...)
		if pos := f.pk.Info.Pos; pos == bth.PosLast || pos == bth.PosOnly {
			msn++
		}
	}
	compare("before the gap", got, wantFor(g.reqs[:k]))
	// After the gap: one NAK, then silence.
	var after [][]byte
	for _, f := range g.reqs[k+1:] {
		after = append(after, g.feed(f)...)
	}
	compare("after the gap", after, [][]byte{g.rxeNAK(gap, msn)})
	c := g.dev.Counters()
	if c.OutOfSeqRequest != 1 || c.DuplicateRequest != 0 {
		t.Fatalf("out_of_seq_request %d duplicate_request %d, want 1 and 0", c.OutOfSeqRequest, c.DuplicateRequest)
	}
	// Go-back-N: the requester resends from the missing PSN.
	var replay [][]byte
	for _, f := range g.reqs[k:] {
		replay = append(replay, g.feed(f)...)
	}
	compare("after going back", replay, wantFor(g.reqs[k:]))
	t.Logf("withheld request %d (psn %v): %d responses before, 1 NAK (msn %d), %d responses after going back, all as rxe", k, gap, len(got), msn, len(replay))
}
