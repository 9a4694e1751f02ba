package transport

import (
	"bytes"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// sgeList registers one buffer per length (each its own MR, with a 7-byte
// prefix before the SGE so addresses are not region starts) and returns
// the SGEs, the views they describe, and the regions.
func (s *side) sgeList(t *testing.T, acc memreg.Access, lens ...int) ([]memreg.SGE, [][]byte) {
	t.Helper()
	var sges []memreg.SGE
	var views [][]byte
	for _, n := range lens {
		buf, mr := s.buffer(t, n+7, acc)
		sges = append(sges, memreg.SGE{Addr: mr.IOVA() + 7, Length: uint32(n), LKey: mr.LKey()})
		views = append(views, buf[7:7+n])
	}
	return sges, views
}

func concat(vs [][]byte) []byte { return bytes.Join(vs, nil) }

// TestMultiSGE gathers SEND/WRITE payloads from three SGEs in three regions
// and scatters SEND payloads and READ responses into three SGEs, with SGE
// boundaries that do not line up with the 256-byte packets.
func TestMultiSGE(t *testing.T) {
	sendLens := []int{100, 300, 250} // 650 bytes: packets of 256, 256, 138
	recvLens := []int{200, 51, 399}  // 650
	const total = 650
	t.Run("SEND", func(t *testing.T) {
		a, b, _ := newPair(t, pairOpts{mtu: MTU256, retry: 7})
		ssges, sviews := a.sgeList(t, 0, sendLens...)
		for i, v := range sviews {
			fill(v, uint64(20+i))
		}
		rsges, rviews := b.sgeList(t, 0, recvLens...)
		if err := b.qp.PostRecv(RecvWR{WRID: 7, SGEs: rsges}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSendImm, Imm: 0xabc, Flags: SendSignaled, SGEs: ssges}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
			t.Fatalf("send %+v", wc)
		}
		wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]
		if wc.WRID != 7 || wc.Status != WCSuccess || wc.ByteLen != total || wc.Flags&WCWithImm == 0 || wc.Imm != 0xabc {
			t.Fatalf("recv %+v", wc)
		}
		if !bytes.Equal(concat(sviews), concat(rviews)) {
			t.Fatal("scattered data differs from gathered data")
		}
	})
	t.Run("SEND-into-larger", func(t *testing.T) {
		// A receive list longer than the message: the tail is untouched.
		a, b, _ := newPair(t, pairOpts{mtu: MTU256, retry: 7})
		ssges, sviews := a.sgeList(t, 0, sendLens...)
		for i, v := range sviews {
			fill(v, uint64(30+i))
		}
		rsges, rviews := b.sgeList(t, 0, 10, 600, 300)
		for _, v := range rviews {
			for i := range v {
				v[i] = 0xee
			}
		}
		if err := b.qp.PostRecv(RecvWR{WRID: 7, SGEs: rsges}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: ssges}); err != nil {
			t.Fatal(err)
		}
		waitWC(t, a.scq, 1, 5*time.Second)
		if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.ByteLen != total {
			t.Fatalf("recv %+v", wc)
		}
		got := concat(rviews)
		if !bytes.Equal(got[:total], concat(sviews)) {
			t.Fatal("data differs")
		}
		for i, c := range got[total:] {
			if c != 0xee {
				t.Fatalf("byte %d past the message was written", total+i)
			}
		}
	})
	t.Run("WRITE", func(t *testing.T) {
		a, b, _ := newPair(t, pairOpts{mtu: MTU256, retry: 7})
		ssges, sviews := a.sgeList(t, 0, sendLens...)
		for i, v := range sviews {
			fill(v, uint64(40+i))
		}
		dst, dmr := b.buffer(t, total+64, memreg.AccessRemoteWrite)
		if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: ssges, RemoteAddr: dmr.IOVA() + 32, RKey: dmr.RKey()}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
			t.Fatalf("%+v", wc)
		}
		if !bytes.Equal(dst[32:32+total], concat(sviews)) {
			t.Fatal("written data differs")
		}
		if !bytes.Equal(dst[:32], make([]byte, 32)) || !bytes.Equal(dst[32+total:], make([]byte, 32)) {
			t.Fatal("bytes outside the target written")
		}
	})
	t.Run("READ", func(t *testing.T) {
		a, b, _ := newPair(t, pairOpts{mtu: MTU256, retry: 7})
		src, smr := b.buffer(t, total, memreg.AccessRemoteRead)
		fill(src, 50)
		lsges, lviews := a.sgeList(t, 0, recvLens...)
		if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: lsges, RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.ByteLen != total || wc.Opcode != WCRDMARead {
			t.Fatalf("%+v", wc)
		}
		if !bytes.Equal(concat(lviews), src) {
			t.Fatal("read data differs")
		}
	})
}

// TestRecvTooSmall: a SEND larger than the receive WQE's three SGEs. The
// responder completes the WQE with a local length error, NAKs with
// INVALID_REQUEST and goes to ERR; the requester completes the SEND with
// "remote invalid request error", flushes the rest and goes to ERR.
func TestRecvTooSmall(t *testing.T) {
	for _, mtu := range []MTU{MTU256, MTU4096} {
		t.Run(mtu.String(), func(t *testing.T) {
			a, b, _, lb := linkPair(t, pairOpts{mtu: mtu, clock: manual()}, 0x700, 0x800)
			ssges, sviews := a.sgeList(t, 0, 100, 300, 250) // 650
			for i, v := range sviews {
				fill(v, uint64(60+i))
			}
			rsges, _ := b.sgeList(t, 0, 200, 51, 398) // 649: one byte short
			if err := b.qp.PostRecv(RecvWR{WRID: 7, SGEs: rsges}, RecvWR{WRID: 8, SGEs: rsges}); err != nil {
				t.Fatal(err)
			}
			if err := a.qp.PostSend(
				SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: ssges},
				SendWR{WRID: 2, Opcode: WRSend, Flags: SendSignaled, SGEs: ssges[:1]},
			); err != nil {
				t.Fatal(err)
			}
			wcs := waitWC(t, a.scq, 2, 5*time.Second)
			if wcs[0].WRID != 1 || wcs[0].Status != WCRemInvReqErr || wcs[0].Status.String() != "remote invalid request error" {
				t.Fatalf("requester %+v (%v)", wcs[0], wcs[0].Status)
			}
			if wcs[1].WRID != 2 || wcs[1].Status != WCWRFlushErr {
				t.Fatalf("requester second %+v", wcs[1])
			}
			rwc := waitWC(t, b.rcq, 2, 5*time.Second)
			if rwc[0].WRID != 7 || rwc[0].Status != WCLocLenErr || rwc[0].Status.String() != "local length error" {
				t.Fatalf("responder %+v (%v)", rwc[0], rwc[0].Status)
			}
			if rwc[1].WRID != 8 || rwc[1].Status != WCWRFlushErr {
				t.Fatalf("responder second %+v", rwc[1])
			}
			if a.qp.State() != QPSErr || b.qp.State() != QPSErr {
				t.Fatalf("states %v %v, want ERR ERR", a.qp.State(), b.qp.State())
			}
			var naks []wirePkt
			for _, w := range lb.sent() {
				if w.isNAK() {
					naks = append(naks, w)
				}
			}
			// The overflowing packet is the third (MTU 256) or the only one.
			wantPSN := uint32(0x700)
			if mtu == MTU256 {
				wantPSN += 2
			}
			if len(naks) != 1 || naks[0].syn != aeth.NAK(aeth.NAKInvalidRequest) || uint32(naks[0].psn) != wantPSN {
				t.Fatalf("responder NAKs %+v, want one INVALID_REQUEST for %#x", naks, wantPSN)
			}
			noWC(t, a.scq)
			noWC(t, b.rcq)
		})
	}
}

// TestMultiSGEUnderLoss: go-back-N restarts in the middle of messages whose
// gather and scatter lists cross packet boundaries at odd offsets; every
// byte must still land where it belongs.
func TestMultiSGEUnderLoss(t *testing.T) {
	a, b, n := newPair(t, pairOpts{mtu: MTU256, faults: memnet.Faults{Loss: 0.05, Seed: 77}, timeout: 12, retry: 7})
	lens := []int{777, 1, 1500}    // 2278 bytes: 9 packets at MTU 256
	rlens := []int{300, 1979, 100} // 2379 bytes
	const total = 2278
	ssges, sviews := a.sgeList(t, 0, lens...)
	rsges, rviews := b.sgeList(t, 0, rlens...)
	lsges, lviews := a.sgeList(t, 0, 300, 1878, 100) // exactly the READ length
	src, smr := b.buffer(t, total, memreg.AccessRemoteRead|memreg.AccessRemoteWrite)
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for r := range rounds {
		for i, v := range sviews {
			fill(v, uint64(r*10+i))
		}
		fill(src, uint64(r*10+9))
		if err := b.qp.PostRecv(RecvWR{WRID: uint64(r), SGEs: rsges}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(
			SendWR{WRID: 1, Opcode: WRSend, Flags: SendSignaled, SGEs: ssges},
			SendWR{WRID: 2, Opcode: WRRead, Flags: SendSignaled, SGEs: lsges, RemoteAddr: smr.IOVA(), RKey: smr.RKey()},
		); err != nil {
			t.Fatal(err)
		}
		wcs := waitWC(t, a.scq, 2, 20*time.Second)
		if wcs[0].WRID != 1 || wcs[0].Status != WCSuccess || wcs[1].WRID != 2 || wcs[1].Status != WCSuccess || wcs[1].ByteLen != total {
			t.Fatalf("round %d: %+v", r, wcs)
		}
		if wc := waitWC(t, b.rcq, 1, 20*time.Second)[0]; wc.WRID != uint64(r) || wc.Status != WCSuccess || wc.ByteLen != total {
			t.Fatalf("round %d: recv %+v", r, wc)
		}
		if !bytes.Equal(concat(rviews)[:total], concat(sviews)) {
			t.Fatalf("round %d: SEND data differs", r)
		}
		if !bytes.Equal(concat(lviews)[:total], src) {
			t.Fatalf("round %d: READ data differs", r)
		}
		// WRITE the gathered list back over the READ source.
		if err := a.qp.PostSend(SendWR{WRID: 3, Opcode: WRWrite, Flags: SendSignaled, SGEs: ssges, RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, a.scq, 1, 20*time.Second)[0]; wc.Status != WCSuccess {
			t.Fatalf("round %d: write %+v", r, wc)
		}
		if !bytes.Equal(src, concat(sviews)) {
			t.Fatalf("round %d: WRITE data differs", r)
		}
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
	c := a.dev.Counters()
	if nc := n.Counters(); nc.Lost > 0 && c.RetransmittedPkts == 0 {
		t.Fatalf("%d packets lost, no retransmission", nc.Lost)
	}
	t.Logf("net %+v; A retransmitted_pkts %d completer_retry_err %d rcvd_seq_err %d", n.Counters(), c.RetransmittedPkts, c.CompleterRetryErr, c.RcvdSeqErr)
}
