package transport

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestMWWorkRequests: a type 2 window bound by a BIND_MW work request on
// the responder's QP serves remote WRITEs through its rkey; a LOCAL_INV
// work request ends that, and the next WRITE fails with the remote access
// NAK; a SEND with Invalidate invalidates a fresh binding remotely; a type
// 1 window bound with BindMW serves a READ; a bind the region does not
// allow completes with the memory management error.
func TestMWWorkRequests(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	src, smr := a.buffer(t, 64, 0)
	copy(src, "through a window")
	dst, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
	mw, err := b.pd.AllocMW(memreg.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(keyByte uint8) uint32 {
		t.Helper()
		if err := b.qp.PostSend(SendWR{WRID: 1, Opcode: WRBindMW, Flags: SendSignaled, MW: mw, RKey: uint32(keyByte),
			Bind: MWBindInfo{MR: dmr, Addr: dmr.IOVA() + 1024, Length: 1024, Access: memreg.AccessRemoteWrite}}); err != nil {
			t.Fatal(err)
		}
		wc := waitWC(t, b.scq, 1, 5*time.Second)[0]
		if wc.Status != WCSuccess || wc.Opcode != WCBindMW {
			t.Fatalf("bind: %+v", wc)
		}
		return mw.RKey()
	}
	rkey := bind(0x42)
	if rkey&0xff != 0x42 {
		t.Fatalf("window rkey %#x, want key byte 0x42", rkey)
	}
	write := func(id uint64) WC {
		t.Helper()
		if err := a.qp.PostSend(SendWR{WRID: id, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 16),
			RemoteAddr: dmr.IOVA() + 1024, RKey: rkey}); err != nil {
			t.Fatal(err)
		}
		return waitWC(t, a.scq, 1, 5*time.Second)[0]
	}
	if wc := write(2); wc.Status != WCSuccess || string(dst[1024:1040]) != "through a window" {
		t.Fatalf("WRITE through the window: %+v", wc)
	}
	// Local invalidate on the responder's QP.
	if err := b.qp.PostSend(SendWR{WRID: 3, Opcode: WRLocalInv, Flags: SendSignaled, InvRKey: rkey}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.Opcode != WCLocalInv {
		t.Fatalf("local invalidate: %+v", wc)
	}
	if wc := write(4); wc.Status != WCRemAccessErr {
		t.Fatalf("WRITE after the invalidate: %v, want remote access error", wc.Status)
	}
}

// TestMWRemoteInvalidateAndType1: SEND with Invalidate ends a type 2
// binding from the requester's side; a type 1 window bound with BindMW
// serves a READ; a bind the region does not allow fails with WCMWBindErr.
func TestMWRemoteInvalidateAndType1(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, smr := a.buffer(t, 64, 0)
	dst, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessMWBind)
	mw2, _ := b.pd.AllocMW(memreg.MWType2)
	if err := b.qp.PostSend(SendWR{Opcode: WRBindMW, MW: mw2, RKey: 7,
		Bind: MWBindInfo{MR: dmr, Addr: dmr.IOVA(), Length: 512, Access: memreg.AccessRemoteWrite}}); err != nil {
		t.Fatal(err)
	}
	rkey := mw2.RKey()
	if err := b.qp.PostRecv(RecvWR{WRID: 9, SGEs: sge(dmr, 2048, 64)}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(SendWR{Opcode: WRSendInv, InvRKey: rkey, Flags: SendSignaled, SGEs: sge(smr, 0, 8)}); err != nil {
		t.Fatal(err)
	}
	waitWC(t, a.scq, 1, 5*time.Second)
	if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Flags&WCWithInv == 0 || wc.InvalidatedRKey != rkey {
		t.Fatalf("SEND with Invalidate: %+v", wc)
	}
	if mw2.Bound() {
		t.Fatal("window still bound after the remote invalidate")
	}
	// Type 1 through the verb.
	mw1, _ := b.pd.AllocMW(memreg.MWType1)
	copy(dst[100:], "type one")
	rkey1, err := b.qp.BindMW(11, mw1, MWBindInfo{MR: dmr, Addr: dmr.IOVA() + 100, Length: 8, Access: memreg.AccessRemoteRead}, SendSignaled)
	if err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.WRID != 11 || wc.Opcode != WCBindMW || wc.Status != WCSuccess {
		t.Fatalf("type 1 bind completion %+v", wc)
	}
	buf, rmr := a.buffer(t, 8, 0)
	if err := a.qp.PostSend(SendWR{Opcode: WRRead, Flags: SendSignaled, SGEs: sge(rmr, 0, 8), RemoteAddr: dmr.IOVA() + 100, RKey: rkey1}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || string(buf) != "type one" {
		t.Fatalf("READ through a type 1 window: %+v %q", wc, buf)
	}
	var we *WRError
	if err := b.qp.PostSend(SendWR{Opcode: WRBindMW, MW: mw1}); !errors.As(err, &we) || we.Field != "bind_mw.mw" {
		t.Fatalf("BIND_MW WR with a type 1 window: %v", err)
	}
	// A region registered without MW_BIND: the bind fails in the send queue.
	_, plain := b.buffer(t, 64, memreg.AccessRemoteWrite)
	mw3, _ := b.pd.AllocMW(memreg.MWType2)
	if err := b.qp.PostSend(SendWR{WRID: 12, Opcode: WRBindMW, Flags: SendSignaled, MW: mw3,
		Bind: MWBindInfo{MR: plain, Addr: plain.IOVA(), Length: 64, Access: memreg.AccessRemoteWrite}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.WRID != 12 || wc.Status != WCMWBindErr {
		t.Fatalf("bind on a region without MW_BIND: %+v", wc)
	}
}

// TestBindMWRefusedLeavesWindowAlone: QP.BindMW that refuses the bind
// because of the QP (not in RTS, send queue full) leaves the window as it
// was — unbound, its rkey unchanged — as ibv_bind_mw does, which posts the
// bind as a work request and fails before anything is bound.
func TestBindMWRefusedLeavesWindowAlone(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{sqDepth: 1}
	o.defaults()
	s := newSide(t, n, addrA, &o) // the QP stays in RESET
	_, mr := s.buffer(t, 4096, memreg.AccessRemoteRead|memreg.AccessMWBind)
	mw, err := s.pd.AllocMW(memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	key := mw.RKey()
	info := MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 64, Access: memreg.AccessRemoteRead}
	if _, err := s.qp.BindMW(1, mw, info, SendSignaled); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("BindMW on a QP in RESET: %v, want ErrInvalidState", err)
	}
	if mw.Bound() || mw.RKey() != key {
		t.Fatalf("after the refused bind: bound %v, rkey %#x (was %#x)", mw.Bound(), mw.RKey(), key)
	}
	// A full send queue: one WR posted on a QP with max_send_wr 1.
	a, b, _ := newPair(t, pairOpts{sqDepth: 1})
	_, amr := a.buffer(t, 4096, memreg.AccessRemoteRead|memreg.AccessMWBind)
	_, bmr := b.buffer(t, 4096, memreg.AccessRemoteRead)
	mw, _ = a.pd.AllocMW(memreg.MWType1)
	key = mw.RKey()
	b.qp.Destroy() // the READ below stays unanswered: the queue stays full
	if err := a.qp.PostSend(SendWR{WRID: 2, Opcode: WRRead, SGEs: sge(amr, 0, 8), RemoteAddr: bmr.IOVA(), RKey: bmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	info.MR, info.Addr = amr, amr.IOVA()
	if _, err := a.qp.BindMW(3, mw, info, SendSignaled); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("BindMW on a full send queue: %v, want ErrQueueFull", err)
	}
	if mw.Bound() || mw.RKey() != key {
		t.Fatalf("after the refused bind: bound %v, rkey %#x (was %#x)", mw.Bound(), mw.RKey(), key)
	}
}

// TestBindMWInErrFlushed: QP.BindMW on a QP in ERR flushes the bind, as
// verbs flush a BIND_MW WR: nil error, the window's rkey unchanged, the
// window not bound, the completion WR_FLUSH_ERR, and a remote WRITE
// through the returned rkey fails. Before, the window was bound (and
// usable remotely) while the completion said flushed.
func TestBindMWInErrFlushed(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 4096, memreg.AccessRemoteWrite|memreg.AccessMWBind)
	mw, err := b.pd.AllocMW(memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	key := mw.RKey()
	// A second QP on b's device, in ERR.
	qp, err := b.dev.CreateQP(b.pd, QPInitAttr{Type: QPTypeRC, SendCQ: b.scq, RecvCQ: b.rcq, MaxSendWR: 4, MaxRecvWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: QPSErr}, AttrState); err != nil {
		t.Fatal(err)
	}
	rkey, err := qp.BindMW(55, mw, MWBindInfo{MR: dmr, Addr: dmr.IOVA(), Length: 64, Access: memreg.AccessRemoteWrite}, SendSignaled)
	if err != nil {
		t.Fatalf("BindMW on a QP in ERR: %v, want nil (the WR is flushed)", err)
	}
	if rkey != key || mw.RKey() != key || mw.Bound() {
		t.Fatalf("after a flushed bind: returned rkey %#x, window rkey %#x (was %#x), bound %v", rkey, mw.RKey(), key, mw.Bound())
	}
	if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.WRID != 55 || wc.Opcode != WCBindMW || wc.Status != WCWRFlushErr {
		t.Fatalf("bind completion %+v, want WR_FLUSH_ERR", wc)
	}
	// The window was not bound: a WRITE through the rkey BindMW returned
	// fails.
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: SendSignaled, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: rkey}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.Status != WCRemAccessErr {
		t.Fatalf("WRITE through the window of a flushed bind: %+v, want remote access error", wc)
	}
}

// TestBindMWErrorNamesKey: a refused type 1 bind names the key at fault:
// the window's rkey when the window's rights are wrong, the region's lkey
// when the range is outside the region. Before, the first named the
// window's table index with key byte 0, a key that does not exist.
func TestBindMWErrorNamesKey(t *testing.T) {
	a, _, _ := newPair(t, pairOpts{})
	_, mr := a.buffer(t, 4096, memreg.AccessRemoteRead|memreg.AccessMWBind)
	mw, _ := a.pd.AllocMW(memreg.MWType1)
	rkey, err := a.qp.BindMW(1, mw, MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 128, Access: memreg.AccessRemoteRead}, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.qp.BindMW(2, mw, MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 128, Access: memreg.AccessLocalWrite}, 0)
	want := fmt.Sprintf("key %#08x", rkey)
	if !errors.Is(err, ErrInvalidWR) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "window's rkey") {
		t.Fatalf("bind with LOCAL_WRITE: %v, want it to name the window's rkey (%s)", err, want)
	}
	_, err = a.qp.BindMW(3, mw, MWBindInfo{MR: mr, Addr: mr.IOVA() + 4000, Length: 128, Access: memreg.AccessRemoteRead}, 0)
	want = fmt.Sprintf("key %#08x", mr.LKey())
	if !errors.Is(err, ErrInvalidWR) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "region's lkey") {
		t.Fatalf("bind past the region: %v, want it to name the region's lkey (%s)", err, want)
	}
}

// TestUnknownSendFlags: PostSend and BindMW refuse send_flags bits the
// library does not implement — IBV_SEND_INLINE (8) included — with a
// *WRError naming send_flags and the bad bits, and post nothing. Before,
// they were silently accepted and ignored.
func TestUnknownSendFlags(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, smr := a.buffer(t, 64, 0)
	_, dmr := b.buffer(t, 64, memreg.AccessRemoteWrite)
	for _, bad := range []SendFlags{8, 0x40, SendSignaled | 0x10} {
		err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWrite, Flags: bad, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()})
		var we *WRError
		if !errors.As(err, &we) || we.Field != "send_flags" || !errors.Is(err, ErrInvalidWR) ||
			!strings.Contains(err.Error(), fmt.Sprintf("%#x", uint8(bad&^SendSignaled))) {
			t.Fatalf("PostSend with flags %#x: %v, want ErrInvalidWR naming send_flags and the bits", uint8(bad), err)
		}
	}
	mw, _ := a.pd.AllocMW(memreg.MWType1)
	_, mr := a.buffer(t, 64, memreg.AccessRemoteRead|memreg.AccessMWBind)
	_, err := a.qp.BindMW(2, mw, MWBindInfo{MR: mr, Addr: mr.IOVA(), Length: 8, Access: memreg.AccessRemoteRead}, SendSignaled|8)
	var we *WRError
	if !errors.As(err, &we) || we.Field != "send_flags" || mw.Bound() {
		t.Fatalf("BindMW with flags 0x0a: %v (bound %v)", err, mw.Bound())
	}
	// The known flags still work, and nothing was posted before.
	if err := a.qp.PostSend(SendWR{WRID: 3, Opcode: WRWrite, Flags: SendSignaled | SendFence | SendSolicited, SGEs: sge(smr, 0, 8), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()}); err != nil {
		t.Fatal(err)
	}
	if wc := waitWC(t, a.scq, 1, 5*time.Second)[0]; wc.WRID != 3 || wc.Status != WCSuccess {
		t.Fatalf("%+v", wc)
	}
	noWC(t, a.scq)
}
