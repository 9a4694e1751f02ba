package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/aeth"
	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/reth"
	"github.com/gorocev2/rocev2/udp"
)

// scriptLink is a udp.Link whose Recv returns the batches the test
// pushes, each one whole, and whose Send records what the device sends.
type scriptLink struct {
	addr    netip.Addr
	in      chan [][]byte
	from    netip.Addr
	done    chan struct{}
	closed  sync.Once
	mu      sync.Mutex
	sent    [][]byte
	nsent   atomic.Int64
	discard bool // Send only counts (benchmarks)
}

func newScriptLink(addr, from netip.Addr) *scriptLink {
	return &scriptLink{addr: addr, from: from, in: make(chan [][]byte, 16), done: make(chan struct{})}
}

func (l *scriptLink) Recv(pkts []udp.Packet) (int, error) {
	select {
	case b := <-l.in:
		if len(b) > len(pkts) {
			panic("scriptLink: batch larger than BatchSize")
		}
		for i, buf := range b {
			pkts[i].Buf = append(pkts[i].Buf[:0], buf...)
			pkts[i].Addr = l.from
			pkts[i].SrcPort = 0xc000
		}
		return len(b), nil
	case <-l.done:
		return 0, net.ErrClosed
	}
}

func (l *scriptLink) Send(pkts []udp.Packet) error {
	l.nsent.Add(int64(len(pkts)))
	if l.discard {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pkts {
		l.sent = append(l.sent, bytes.Clone(p.Buf))
	}
	return nil
}

func (l *scriptLink) LocalAddr() netip.Addr { return l.addr }
func (l *scriptLink) BatchSize() int        { return 64 }
func (l *scriptLink) Stats() udp.Stats      { return udp.Stats{} }
func (l *scriptLink) Close() error {
	l.closed.Do(func() { close(l.done) })
	return nil
}

// sentPackets parses what the device sent so far.
func (l *scriptLink) sentPackets(t testing.TB) []packet.Packet {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]packet.Packet, len(l.sent))
	for i, b := range l.sent {
		if err := out[i].Parse(b); err != nil {
			t.Fatalf("sent packet %d: %v", i, err)
		}
	}
	return out
}

// scriptedResponder is a device on a scriptLink with one QP in RTR/RTS
// whose peer (QPN peerQPN at addrA) is the test.
func scriptedResponder(t testing.TB, mtu MTU, rqPSN uint32) (*side, *scriptLink) {
	t.Helper()
	l := newScriptLink(addrB, addrA)
	return scriptedResponderOn(t, l, mtu, rqPSN), l
}

// zcScriptLink is a scriptLink with zero-copy send (udp.CapZeroCopy):
// packets whose payload lies in registered memory are recorded whole.
type zcScriptLink struct{ *scriptLink }

func (l zcScriptLink) ZeroCopy() bool { return true }

func (l zcScriptLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range pkts {
		l.sent = append(l.sent, pkts[i].AppendWire(nil))
	}
	return nil
}

// scriptedResponderOn is scriptedResponder on link ul (a scriptLink or
// a wrapper of one).
func scriptedResponderOn(t testing.TB, ul udp.Link, mtu MTU, rqPSN uint32) *side {
	t.Helper()
	o := pairOpts{clock: manual(), mtu: mtu}
	o.defaults()
	s := sideOn(t, ul, &o)
	a := QPAttr{State: QPSInit, Port: 1, AccessFlags: o.access}
	if err := s.qp.Modify(&a, AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	a = QPAttr{State: QPSRTR, AV: AddressVector{Addr: addrA}, PathMTU: mtu, DestQPN: peerQPN,
		RQPSN: rqPSN, MaxDestRdAtomic: 4}
	if err := s.qp.Modify(&a, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	return s
}

const peerQPN = 0x99

// build builds one request packet for qp.
func build(t testing.TB, qp *QP, psn bth.PSN, f packet.Fields) []byte {
	t.Helper()
	f.BTH.PKey = bth.DefaultPKey
	f.BTH.DestQP = qp.QPN()
	f.BTH.PSN = psn
	buf := make([]byte, packet.Len(f.BTH.Opcode, len(f.Payload)))
	n, err := packet.Build(buf, &f)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// TestBatchWriteThenSendInvalidate: one received batch carries an RDMA
// WRITE through a type 2 window (the receive goroutine pins the window for
// the batch) and then a SEND with Invalidate of that window. The
// invalidation waits for the window's pins, so the batch's pins are
// released first: no self-deadlock, the WRITE landed, the window is
// invalidated, and a later WRITE through it is NAKed with a remote access
// error.
func TestBatchWriteThenSendInvalidate(t *testing.T) {
	s, l := scriptedResponder(t, MTU1024, 0x100)
	buf := make([]byte, 4096)
	mr, err := s.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := s.pd.AllocMW(memreg.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	rkey, err := mw.BindQP(s.qp.QPN(), mr, mr.IOVA()+1024, 2048, memreg.AccessRemoteWrite, 0x5a)
	if err != nil {
		t.Fatal(err)
	}
	rbuf, rmr := s.buffer(t, 256, 0)
	if err := s.qp.PostRecv(RecvWR{WRID: 7, SGEs: sge(rmr, 0, 256)}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xc3}, 1024)
	w := reqOnly(bth.RCWriteFirst, data)
	w.BTH.AckReq = false
	w.RETH = reth.Fields{VA: mr.IOVA() + 1024, RKey: rkey, DMALength: 2048}
	w2 := reqOnly(bth.RCWriteLast, data)
	inv := reqOnly(bth.RCSendOnlyInv, []byte("hello"))
	inv.IETHRKey = rkey
	l.in <- [][]byte{build(t, s.qp, 0x100, w), build(t, s.qp, 0x101, w2), build(t, s.qp, 0x102, inv)}

	wc := waitWC(t, s.rcq, 1, 5*time.Second)[0]
	if wc.WRID != 7 || wc.Status != WCSuccess || wc.Flags&WCWithInv == 0 || wc.InvalidatedRKey != rkey || wc.ByteLen != 5 {
		t.Fatalf("receive completion %+v, want success with invalidated rkey %#x", wc, rkey)
	}
	if !bytes.Equal(buf[1024:3072], bytes.Repeat([]byte{0xc3}, 2048)) || string(rbuf[:5]) != "hello" {
		t.Fatal("WRITE or SEND data not placed")
	}
	if mw.Bound() {
		t.Fatal("window still bound after SEND with Invalidate")
	}
	// A WRITE through the invalidated window: remote access error NAK.
	late := reqOnly(bth.RCWriteOnly, bytes.Repeat([]byte{0x11}, 8))
	late.RETH = reth.Fields{VA: mr.IOVA() + 1024, RKey: rkey, DMALength: 8}
	l.in <- [][]byte{build(t, s.qp, 0x103, late)}
	// The batch's two ACKs (WRITE LAST 0x101, SEND 0x102) are coalesced
	// into one for 0x102.
	eventually(t, "the NAK", func() bool { return len(l.sentPackets(t)) == 2 })
	sent := l.sentPackets(t)
	for i, want := range []struct {
		psn bth.PSN
		syn aeth.Syndrome
	}{{0x102, aeth.ACK(aeth.NoCreditLimit)}, {0x103, aeth.NAK(aeth.NAKRemoteAccessError)}} {
		p := &sent[i]
		if p.BTH.Opcode() != bth.RCAck || p.BTH.PSN() != want.psn || p.AETH.Syndrome() != want.syn {
			t.Errorf("sent[%d]: %v psn %v %v, want ACK psn %v %v", i, p.BTH.Opcode(), p.BTH.PSN(), p.AETH.Syndrome(), want.psn, want.syn)
		}
	}
	if !bytes.Equal(buf[1024:1032], bytes.Repeat([]byte{0xc3}, 8)) {
		t.Fatal("late WRITE through the invalidated window changed memory")
	}
}

// TestZeroCopyReadThenSendInvalidate: on a zero-copy link, a READ
// through a type 2 window and a SEND with Invalidate of that window,
// received in one batch. The READ executes first, so its responses carry
// the window's data: they leave before the invalidation (flushZeroCopy)
// instead of being dropped at the end of the batch (zero_copy_dropped),
// after which the requester's resent READ met the invalidated rkey and
// failed with a remote access error. A READ longer than a scheduler
// quantum (103 packets) holds the SEND behind it, which then executes in
// the QP's scheduler turn right after the response's last packets: the
// same.
func TestZeroCopyReadThenSendInvalidate(t *testing.T) {
	for _, size := range []int{4096, 103 << 10} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			l := newScriptLink(addrB, addrA)
			s := scriptedResponderOn(t, zcScriptLink{l}, MTU1024, 0x100)
			if !s.dev.zc {
				t.Fatal("device does not send zero-copy")
			}
			buf := make([]byte, size)
			fill(buf, 28)
			mr, err := s.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
			if err != nil {
				t.Fatal(err)
			}
			mw, err := s.pd.AllocMW(memreg.MWType2)
			if err != nil {
				t.Fatal(err)
			}
			rkey, err := mw.BindQP(s.qp.QPN(), mr, mr.IOVA(), uint64(size), memreg.AccessRemoteRead, 0x5a)
			if err != nil {
				t.Fatal(err)
			}
			_, rmr := s.buffer(t, 64, 0)
			if err := s.qp.PostRecv(RecvWR{WRID: 7, SGEs: sge(rmr, 0, 64)}); err != nil {
				t.Fatal(err)
			}
			rd := reqOnly(bth.RCReadRequest, nil)
			rd.RETH = reth.Fields{VA: mr.IOVA(), RKey: rkey, DMALength: uint32(size)}
			npk := size / 1024
			inv := reqOnly(bth.RCSendOnlyInv, []byte("done"))
			inv.IETHRKey = rkey
			l.in <- [][]byte{build(t, s.qp, 0x100, rd), build(t, s.qp, bth.PSN(0x100).Add(npk), inv)}
			wc := waitWC(t, s.rcq, 1, 5*time.Second)[0]
			if wc.WRID != 7 || wc.Status != WCSuccess || wc.Flags&WCWithInv == 0 || wc.InvalidatedRKey != rkey {
				t.Fatalf("receive completion %+v", wc)
			}
			eventually(t, "the SEND's ACK", func() bool {
				sent := l.sentPackets(t)
				return len(sent) > 0 && sent[len(sent)-1].BTH.Opcode() == bth.RCAck
			})
			sent := l.sentPackets(t)
			if len(sent) != npk+1 {
				t.Fatalf("sent %d packets, want %d READ responses and an ACK (zero_copy_dropped %d)", len(sent), npk, s.dev.Counters().ZeroCopyDropped)
			}
			var got []byte
			for i, p := range sent[:npk] {
				if p.BTH.Opcode().Info().Kind != bth.KindReadResponse || p.BTH.PSN() != bth.PSN(0x100).Add(i) {
					t.Fatalf("sent[%d]: %v psn %v, want a READ response psn %v", i, p.BTH.Opcode(), p.BTH.PSN(), bth.PSN(0x100).Add(i))
				}
				got = append(got, p.Payload...)
			}
			if !bytes.Equal(got, buf) {
				t.Fatal("READ response data differs from the region")
			}
			if a := sent[npk]; a.BTH.Opcode() != bth.RCAck || a.BTH.PSN() != bth.PSN(0x100).Add(npk) || a.AETH.Syndrome() != aeth.ACK(aeth.NoCreditLimit) {
				t.Fatalf("last packet %v psn %v, want the SEND's ACK", a.BTH.Opcode(), a.BTH.PSN())
			}
			if c := s.dev.Counters(); c.ZeroCopyDropped != 0 || mw.Bound() {
				t.Fatalf("zero_copy_dropped %d, window bound %v", c.ZeroCopyDropped, mw.Bound())
			}
		})
	}
}

// TestNoWriteAfterDeregisterWhileStreaming: a peer streams RDMA WRITEs
// (128 KiB each, MTU 1024, 8 outstanding, so that every message spans
// several received batches; consecutive WRITEs to one place carry
// different bytes) into a region that the responder's application
// deregisters mid-stream; the same with SENDs into receive WQEs in that
// region; and with RDMA READs whose destination region the requester's
// application deregisters (the requester places the responses; the READ
// then completes with a local protection error). The placing side holds
// the region's pin across each received
// batch; Deregister waits for that batch, and once it has returned no
// byte of the region changes: the stream ends with the NAK for the next
// packet (remote access error for a WRITE, remote operational error for a
// SEND: its receive buffer is gone), both QPs go to ERR, and the memory
// equals the snapshot taken right after Deregister returned. Under -race
// a placement after Deregister would also be reported as a data race with
// that snapshot.
func TestNoWriteAfterDeregisterWhileStreaming(t *testing.T) {
	rounds := 3
	if testing.Short() || raceEnabled {
		rounds = 2
	}
	for _, op := range []WROpcode{WRWrite, WRSend, WRRead} {
		for round := range rounds {
			t.Run(fmt.Sprintf("%v/%d", op, round), func(t *testing.T) { deregisterWhileStreaming(t, op, round) })
		}
	}
}

func deregisterWhileStreaming(t *testing.T, op WROpcode, round int) {
	const (
		chunk  = 128 << 10
		chunks = 4
		slots  = 5 // source patterns; slots and chunks coprime
	)
	// rnr_retry 7 (infinite) with a 0.01 ms RNR timer: a receiver that is
	// slow to repost must not end the stream.
	a, b, _ := newPair(t, pairOpts{mtu: MTU1024, retry: 7, rnrRetry: 7, minRNR: 1})
	// dst (in mr) is the memory the stream places into and that is
	// deregistered: b's for WRITE and SEND, a's for READ (the requester
	// places the responses). src (in smr) holds the patterns.
	dside, sside := b, a
	if op == WRRead {
		dside, sside = a, b
	}
	dst := make([]byte, chunks*chunk)
	mr, err := dside.pd.RegisterMR(dst, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	src, smr := sside.buffer(t, slots*chunk, memreg.AccessRemoteRead)
	for i := range src {
		src[i] = byte(i/chunk*37 + i%251 + 1)
	}
	wantEnd, failed := WCRemAccessErr, b.qp
	if op == WRRead {
		wantEnd, failed = WCLocProtErr, a.qp
	}
	var recvDone chan struct{}
	if op == WRSend {
		// The receiver keeps 64 receive WQEs posted, WQE i on chunk
		// i % chunks, reposting one as each completes.
		wantEnd = WCRemOpErr
		post := func(i uint64) error {
			return b.qp.PostRecv(RecvWR{WRID: i, SGEs: sge(mr, int(i%chunks)*chunk, chunk)})
		}
		for i := range uint64(64) {
			if err := post(i); err != nil {
				t.Fatal(err)
			}
		}
		recvDone = make(chan struct{})
		go func() {
			defer close(recvDone)
			var wc [8]WC
			for next := uint64(64); ; {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				n, err := b.rcq.Wait(ctx, wc[:])
				cancel()
				if err != nil {
					return
				}
				for _, c := range wc[:n] {
					if c.Status != WCSuccess || post(next) != nil {
						return
					}
					next++
				}
			}
		}()
	}

	var completed atomic.Int64
	result := make(chan string, 1)
	go func() {
		var wc [16]WC
		outstanding := 0
		posting := true
		for i := uint64(0); ; {
			for ; posting && outstanding < 8; outstanding++ {
				wr := SendWR{WRID: i, Opcode: op, Flags: SendSignaled, SGEs: sge(smr, int(i%slots)*chunk, chunk),
					RemoteAddr: mr.IOVA() + i%chunks*chunk, RKey: mr.RKey()}
				if op == WRRead {
					wr.SGEs = sge(mr, int(i%chunks)*chunk, chunk)
					wr.RemoteAddr, wr.RKey = smr.IOVA()+i%slots*chunk, smr.RKey()
				}
				if err := a.qp.PostSend(wr); err != nil {
					if op == WRRead && errors.Is(err, memreg.ErrStaleKey) {
						// The READ destination is gone: PostSend checks
						// it. Wait for the READs in flight.
						posting = false
						break
					}
					result <- fmt.Sprintf("PostSend: %v", err)
					return
				}
				i++
			}
			if outstanding == 0 {
				result <- "drained"
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			n, err := a.scq.Wait(ctx, wc[:])
			cancel()
			if err != nil {
				result <- fmt.Sprintf("waiting for completions: %v", err)
				return
			}
			for _, c := range wc[:n] {
				outstanding--
				if c.Status != WCSuccess {
					result <- c.Status.String()
					return
				}
				completed.Add(1)
			}
		}
	}()

	eventually(t, "messages landing", func() bool { return completed.Load() >= int64(4+round*5) })
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	snap := bytes.Clone(dst)
	select {
	case r := <-result:
		switch {
		case r == wantEnd.String():
			eventually(t, "the failed QP in ERR", func() bool { return failed.State() == QPSErr })
		case r == "drained" && op == WRRead:
			// Every READ in flight had all its data placed before
			// Deregister returned (rare): nothing failed, nothing may
			// change either.
			t.Log("no READ was in flight when Deregister returned")
		default:
			t.Fatalf("stream ended with %q, want %q (the NAK of a packet after Deregister)", r, wantEnd)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("stream did not end after Deregister")
	}
	if recvDone != nil {
		<-recvDone
	}
	if !bytes.Equal(dst, snap) {
		t.Fatal("registered memory changed after Deregister returned")
	}
	if !bytes.ContainsFunc(snap, func(r rune) bool { return r != 0 }) {
		t.Fatal("nothing landed before Deregister: the test did not exercise the stream")
	}
	t.Logf("%d messages completed before Deregister; placing device's counters %+v", completed.Load(), dside.dev.Counters())
}

// TestBatchedNAKAfterDeregister: through the batched receive path, a
// multi-packet WRITE (and a multi-packet SEND) whose region is
// deregistered between two received batches: the first batch lands, the
// next packet is NAKed exactly as the unbatched path NAKs it (remote
// access error for the WRITE, remote operational error for the SEND, both
// with that packet's PSN and the MSN so far), the QP goes to ERR and the
// memory is not touched after Deregister returned.
func TestBatchedNAKAfterDeregister(t *testing.T) {
	for _, send := range []bool{false, true} {
		t.Run(fmt.Sprintf("send=%v", send), func(t *testing.T) {
			s, l := scriptedResponder(t, MTU256, 0x200)
			buf := make([]byte, 1024)
			mr, err := s.pd.RegisterMR(buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			first, middle := bth.RCWriteFirst, bth.RCWriteMiddle
			wantCode := aeth.NAKRemoteAccessError
			if send {
				first, middle = bth.RCSendFirst, bth.RCSendMiddle
				wantCode = aeth.NAKRemoteOperationalError
				if err := s.qp.PostRecv(RecvWR{WRID: 1, SGEs: sge(mr, 0, 1024)}); err != nil {
					t.Fatal(err)
				}
			}
			pkt := func(op bth.Opcode, psn bth.PSN, fillByte byte, ackReq bool) []byte {
				f := reqOnly(op, bytes.Repeat([]byte{fillByte}, 256))
				f.BTH.AckReq = ackReq
				if op == bth.RCWriteFirst {
					f.RETH = reth.Fields{VA: mr.IOVA(), RKey: mr.RKey(), DMALength: 1024}
				}
				return build(t, s.qp, psn, f)
			}
			l.in <- [][]byte{pkt(first, 0x200, 1, false), pkt(middle, 0x201, 2, true)}
			eventually(t, "the ACK of the first batch", func() bool { return len(l.sentPackets(t)) == 1 })
			if err := mr.Deregister(); err != nil {
				t.Fatal(err)
			}
			snap := bytes.Clone(buf)
			if !bytes.Equal(buf[:512], append(bytes.Repeat([]byte{1}, 256), bytes.Repeat([]byte{2}, 256)...)) {
				t.Fatal("first batch not placed")
			}
			l.in <- [][]byte{pkt(middle, 0x202, 3, false), pkt(middle, 0x203, 4, false)}
			eventually(t, "the NAK", func() bool { return len(l.sentPackets(t)) == 2 })
			eventually(t, "ERR", func() bool { return s.qp.State() == QPSErr })
			sent := l.sentPackets(t)
			if p := &sent[0]; p.BTH.PSN() != 0x201 || p.AETH.Syndrome() != aeth.ACK(aeth.NoCreditLimit) {
				t.Errorf("first response: psn %v %v, want ACK psn 0x201", p.BTH.PSN(), p.AETH.Syndrome())
			}
			if p := &sent[1]; p.BTH.Opcode() != bth.RCAck || p.BTH.PSN() != 0x202 || p.AETH.Syndrome() != aeth.NAK(wantCode) || p.AETH.MSN() != 0 {
				t.Errorf("second response: %v psn %v %v msn %d, want NAK %v psn 0x202 msn 0", p.BTH.Opcode(), p.BTH.PSN(), p.AETH.Syndrome(), p.AETH.MSN(), wantCode)
			}
			if !bytes.Equal(buf, snap) {
				t.Fatal("memory changed after Deregister returned")
			}
			if send {
				wc := waitWC(t, s.rcq, 1, 5*time.Second)[0]
				if wc.WRID != 1 || wc.Status != WCLocProtErr {
					t.Fatalf("receive completion %+v, want local protection error", wc)
				}
			}
		})
	}
}
