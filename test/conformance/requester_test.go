package conformance

import (
	"bytes"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/test/golden"
	"github.com/gorocev2/rocev2/transport"
)

// TestRequesterMatchesRxe rebuilds the work requests behind the request
// packets of each requesting host in a capture (the client, or both hosts
// of an ibv_rc_pingpong capture, one at a time), posts them on a requester
// QP with the capture's QPN and PSN, and compares the packets it sends with
// rxe's byte for byte (ICRC aside); then it feeds rxe's responses back and
// checks that every work request completes successfully (READ data and
// atomic results included).
func TestRequesterMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	for _, name := range []string{"rc_write_64", "rc_write_4096", "rc_write_imm_64", "rc_write_imm_3000",
		"rc_read_64", "rc_read_4096", "rc_atomic_fadd", "rc_atomic_cswap", "rc_send_bw_64", "rc_send_imm_62",
		"rc_send_64", "rc_send_4096"} {
		t.Run(name, func(t *testing.T) {
			frames := load(t, filepath.Join(dir, name+".pcap"))
			hosts := requesters(frames)
			if len(hosts) == 1 {
				checkRequester(t, frames, hosts[0], -1)
				return
			}
			// ibv_rc_pingpong: both hosts send. Each direction is its own
			// requester (the client's SENDs and the server's ACKs of
			// them, then the server's SENDs and the client's ACKs).
			for _, h := range hosts {
				t.Run(h.String(), func(t *testing.T) { checkRequester(t, frames, h, -1) })
			}
		})
	}
}

// TestRequesterGoBackNMatchesRxe: after a PSN sequence error NAK naming one
// of the request packets (the second, and one in the middle), the requester
// resends from that packet on exactly the packets rxe sent, and rxe's
// responses then complete every work request.
func TestRequesterGoBackNMatchesRxe(t *testing.T) {
	dir := golden.Dir(t)
	for _, name := range []string{"rc_write_4096", "rc_write_imm_3000", "rc_read_4096", "rc_atomic_fadd", "rc_atomic_cswap", "rc_send_bw_64", "rc_send_imm_62"} {
		t.Run(name, func(t *testing.T) {
			frames := load(t, filepath.Join(dir, name+".pcap"))
			h := requesters(frames)[0]
			n := 0
			for _, f := range frames {
				if f.pk.Info.Transport == bth.TransportRC && f.pk.Info.Request && f.src == h {
					n++
				}
			}
			for _, k := range []int{1, n / 2} {
				t.Run(fmt.Sprint("nak-at-", k), func(t *testing.T) { checkRequester(t, frames, h, k) })
			}
		})
	}
}

// requesters returns the source addresses of the capture's RC requests in
// order of first appearance.
func requesters(frames []*frame) []netip.Addr {
	var hs []netip.Addr
	for _, f := range frames {
		if f.pk.Info.Transport == bth.TransportRC && f.pk.Info.Request && !slices.Contains(hs, f.src) {
			hs = append(hs, f.src)
		}
	}
	return hs
}

// checkRequester replays the requester side of host h: its requests are
// what a transport QP must send, the responses addressed to h are fed back.
// With nakAt >= 0 a PSN sequence error NAK for request packet nakAt is fed
// first: the requester must go back and send rxe's packets from nakAt on
// again, byte for byte.
func checkRequester(t *testing.T, frames []*frame, h netip.Addr, nakAt int) {
	var reqs, resps []*frame
	for _, f := range frames {
		if f.pk.Info.Transport != bth.TransportRC {
			continue
		}
		if f.pk.Info.Request && f.src == h {
			reqs = append(reqs, f)
		} else if !f.pk.Info.Request && f.dst == h {
			resps = append(resps, f)
		}
	}
	if len(reqs) == 0 || len(resps) == 0 {
		t.Fatalf("capture has %d requests from %v and %d responses to it", len(reqs), h, len(resps))
	}
	peer := reqs[0].dst
	link := newRecLink(h)
	dev, err := transport.NewDevice(link, transport.DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	local := make([]byte, 1<<20)
	lmr, err := pd.RegisterMR(local, memreg.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cq, _ := dev.CreateCQ(1024)
	localQPN, peerQPN := resps[0].pk.BTH.DestQP(), reqs[0].pk.BTH.DestQP()
	var qp *transport.QP
	for i := 0; i < 64 && (qp == nil || qp.QPN() != localQPN); i++ {
		if qp, err = dev.CreateQP(pd, transport.QPInitAttr{Type: transport.QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, MaxRecvWR: 16}); err != nil {
			t.Fatal(err)
		}
	}
	if qp.QPN() != localQPN {
		t.Fatalf("could not get QPN %#x", localQPN)
	}
	connectRTS(t, qp, peer, peerQPN, uint32(reqs[0].pk.BTH.PSN()))

	// Rebuild the WRs: one per message (a first or only packet).
	var wrs []transport.SendWR
	var want [][]byte // expected local data after completion (READ / atomics)
	off := 0
	for i := 0; i < len(reqs); i++ {
		p := &reqs[i].pk
		if p.Info.Pos != bth.PosFirst && p.Info.Pos != bth.PosOnly {
			continue
		}
		wr := transport.SendWR{WRID: uint64(len(wrs)), Flags: transport.SendSignaled}
		var n int
		var data []byte
		// Gather the message's payload up to its last packet.
		for j := i; j < len(reqs); j++ {
			q := &reqs[j].pk
			data = append(data, q.Payload...)
			if q.Info.Imm {
				wr.Imm = q.ImmDt.Imm()
			}
			if q.Info.Pos == bth.PosLast || q.Info.Pos == bth.PosOnly {
				break
			}
		}
		switch p.Info.Kind {
		case bth.KindWrite, bth.KindSend:
			wr.Opcode = map[bool]transport.WROpcode{false: transport.WRSend, true: transport.WRSendImm}[wr.Imm != 0]
			if p.Info.Kind == bth.KindWrite {
				wr.Opcode = map[bool]transport.WROpcode{false: transport.WRWrite, true: transport.WRWriteImm}[wr.Imm != 0]
				wr.RemoteAddr, wr.RKey = p.RETH.VA(), p.RETH.RKey()
			}
			n = len(data)
			copy(local[off:], data)
			want = append(want, nil)
		case bth.KindReadRequest:
			wr.Opcode = transport.WRRead
			wr.RemoteAddr, wr.RKey = p.RETH.VA(), p.RETH.RKey()
			n = int(p.RETH.DMALength())
			var rd []byte
			for _, r := range resps {
				if d := int(r.pk.BTH.PSN().Diff(p.BTH.PSN())); r.pk.Info.Kind == bth.KindReadResponse && d >= 0 && d < max(1, (n+1023)/1024) {
					rd = append(rd, r.pk.Payload...)
				}
			}
			want = append(want, rd)
		case bth.KindFetchAdd, bth.KindCompareSwap:
			wr.Opcode = transport.WRFetchAdd
			wr.CompareAdd = p.AtomicETH.SwapAdd()
			if p.Info.Kind == bth.KindCompareSwap {
				wr.Opcode = transport.WRCompareSwap
				wr.CompareAdd, wr.Swap = p.AtomicETH.Compare(), p.AtomicETH.SwapAdd()
			}
			wr.RemoteAddr, wr.RKey = p.AtomicETH.VA(), p.AtomicETH.RKey()
			n = 8
			for _, r := range resps {
				if r.pk.Info.Kind == bth.KindAtomicAck && r.pk.BTH.PSN() == p.BTH.PSN() {
					var b [8]byte
					putNative(b[:], r.pk.AtomicAck.OrigData())
					want = append(want, b[:])
				}
			}
		}
		if n > 0 {
			wr.SGEs = []memreg.SGE{{Addr: lmr.IOVA() + uint64(off), Length: uint32(n), LKey: lmr.LKey()}}
		}
		wrs = append(wrs, wr)
		off += (n + 63) &^ 63
	}
	if err := qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	got := link.take()
	if len(got) != len(reqs) {
		t.Fatalf("sent %d packets, rxe sent %d", len(got), len(reqs))
	}
	for i, r := range reqs {
		g := got[i]
		where := fmt.Sprintf("request %d (rxe frame %d, %v psn %v)", i, r.num, r.pk.BTH.Opcode(), r.pk.BTH.PSN())
		if !bytes.Equal(g.Buf[:len(g.Buf)-4], r.payload[:len(r.payload)-4]) {
			var p packet.Packet
			_ = p.Parse(g.Buf)
			t.Errorf("%s: bytes differ (ours %v psn %v ackreq %v)\nours % x\nrxe  % x", where, p.BTH.Opcode(), p.BTH.PSN(), p.BTH.AckReq(),
				g.Buf[:min(len(g.Buf)-4, 48)], r.payload[:min(len(r.payload)-4, 48)])
		}
		if g.SrcPort != r.sport || g.Addr != r.dst {
			t.Errorf("%s: sent from port %d to %v, rxe from %d to %v", where, g.SrcPort, g.Addr, r.sport, r.dst)
		}
	}
	if nakAt >= 0 {
		// The responder answered the requests before nakAt as rxe did
		// (READ data and atomic results must arrive before a NAK beyond
		// them, or the requester rightly re-requests them), then saw a
		// gap at request nakAt.
		for _, r := range resps {
			if r.pk.BTH.PSN().Before(reqs[nakAt].pk.BTH.PSN()) {
				if err := dev.HandlePacket(bytes.Clone(r.payload), peer); err != nil {
					t.Fatal(err)
				}
			}
		}
		if extra := link.take(); len(extra) != 0 {
			t.Fatalf("%d packets sent on rxe's responses before the gap", len(extra))
		}
		msn := uint32(0)
		for _, r := range reqs[:nakAt] {
			if pos := r.pk.Info.Pos; pos == bth.PosLast || pos == bth.PosOnly {
				msn++
			}
		}
		var f packet.Fields
		f.BTH.Opcode = bth.RCAck
		f.BTH.PKey = bth.DefaultPKey
		f.BTH.DestQP = localQPN
		f.BTH.PSN = reqs[nakAt].pk.BTH.PSN()
		f.AETH.Syndrome = aeth.NAK(aeth.NAKPSNSeqError)
		f.AETH.MSN = msn
		nak := make([]byte, 64)
		k, err := packet.Build(nak, &f)
		if err != nil {
			t.Fatal(err)
		}
		if err := dev.HandlePacket(nak[:k], peer); err != nil {
			t.Fatal(err)
		}
		again := link.take()
		if len(again) != len(reqs)-nakAt {
			t.Fatalf("after a PSN sequence NAK for request %d: %d packets, want %d", nakAt, len(again), len(reqs)-nakAt)
		}
		for i, g := range again {
			r := reqs[nakAt+i]
			if !bytes.Equal(g.Buf[:len(g.Buf)-4], r.payload[:len(r.payload)-4]) {
				t.Errorf("retransmitted request %d (rxe frame %d, %v psn %v): bytes differ\nours % x\nrxe  % x", nakAt+i, r.num, r.pk.BTH.Opcode(), r.pk.BTH.PSN(),
					g.Buf[:min(len(g.Buf)-4, 48)], r.payload[:min(len(r.payload)-4, 48)])
			}
		}
		if c := dev.Counters(); c.RcvdSeqErr != 1 || c.RetransmittedPkts != uint64(len(again)) {
			t.Errorf("rcvd_seq_err %d retransmitted_pkts %d, want 1 and %d", c.RcvdSeqErr, c.RetransmittedPkts, len(again))
		}
	}
	// rxe's responses complete everything.
	for _, r := range resps {
		if err := dev.HandlePacket(bytes.Clone(r.payload), peer); err != nil {
			t.Fatal(err)
		}
	}
	var wc [64]transport.WC
	n := cq.Poll(wc[:])
	if n != len(wrs) {
		t.Fatalf("%d completions for %d WRs: %+v", n, len(wrs), wc[:n])
	}
	off = 0
	for i := 0; i < n; i++ {
		if wc[i].WRID != uint64(i) || wc[i].Status != transport.WCSuccess {
			t.Errorf("completion %d: %+v", i, wc[i])
		}
		l := int(wrs[i].SGEs[0].Length)
		if want[i] != nil && !bytes.Equal(local[off:off+l], want[i]) {
			t.Errorf("WR %d (%v): local data differs from what rxe returned", i, wrs[i].Opcode)
		}
		off += (l + 63) &^ 63
	}
	if extra := link.take(); len(extra) != 0 {
		t.Errorf("%d unexpected packets after the responses", len(extra))
	}
	t.Logf("%d WRs -> %d request packets identical to rxe's; %d responses completed them", len(wrs), len(reqs), len(resps))
}

func connectRTS(t *testing.T, qp *transport.QP, peer netip.Addr, peerQPN, sqPSN uint32) {
	t.Helper()
	// No remote access: these QPs only request.
	if err := qp.Connect(transport.ConnParams{Peer: peer, DestQPN: peerQPN, RQPSN: 0, SQPSN: sqPSN,
		PathMTU: transport.MTU1024, Access: 0, MaxRdAtomic: 16, MaxDestRdAtomic: 16}); err != nil {
		t.Fatal(err)
	}
}
