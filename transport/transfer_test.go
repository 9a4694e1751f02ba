package transport

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
)

// TestTransferByteExact runs every data operation with sizes 0, 1, MTU-1,
// MTU, MTU+1 and 1 MiB at path MTU 256, 1024 and 4096 over a fault-free
// MemNetwork and compares every byte and every completion field.
func TestTransferByteExact(t *testing.T) {
	ops := []WROpcode{WRSend, WRSendImm, WRSendInv, WRWrite, WRWriteImm, WRRead}
	for _, mtu := range []MTU{MTU256, MTU1024, MTU4096} {
		a, b, _ := newPair(t, pairOpts{mtu: mtu, retry: 7}) // retry 7: a scheduling stall > 67 ms under -race on 2 cores must not fail a clean transfer
		m := mtu.Bytes()
		for _, op := range ops {
			for _, size := range []int{0, 1, m - 1, m, m + 1, 1 << 20} {
				name := fmt.Sprintf("mtu%d/%v/%d", m, op, size)
				t.Run(name, func(t *testing.T) {
					transferOnce(t, a, b, op, size, uint64(size)*31+uint64(op))
				})
			}
		}
	}
}

func transferOnce(t *testing.T, a, b *side, op WROpcode, size int, seed uint64) {
	remoteAcc := memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessMWBind
	src, srcMR := a.buffer(t, size, 0)
	dst, dstMR := b.buffer(t, size, remoteAcc)
	if op == WRRead {
		// READ pulls b's memory into a's.
		fill(dst[:size], seed)
	} else {
		fill(src[:size], seed)
	}
	wr := SendWR{WRID: seed, Opcode: op, Flags: SendSignaled, SGEs: sge(srcMR, 0, size),
		RemoteAddr: dstMR.IOVA(), RKey: dstMR.RKey(), Imm: 0xdeadbeef}
	var mw *memreg.MW
	if op == WRSendInv {
		var err error
		mw, err = b.pd.AllocMW(memreg.MWType2)
		if err != nil {
			t.Fatal(err)
		}
		rk, err := mw.BindQP(b.qp.QPN(), dstMR, dstMR.IOVA(), uint64(max(size, 1)), memreg.AccessRemoteWrite, 0x42)
		if err != nil {
			t.Fatal(err)
		}
		wr.InvRKey = rk
	}
	needRecv := op == WRSend || op == WRSendImm || op == WRSendInv || op == WRWriteImm
	if needRecv {
		var sg []memreg.SGE
		if op != WRWriteImm {
			sg = sge(dstMR, 0, size)
		}
		if err := b.qp.PostRecv(RecvWR{WRID: 77, SGEs: sg}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	wcs := waitWC(t, a.scq, 1, 30*time.Second)
	wc := wcs[0]
	if wc.Status != WCSuccess || wc.WRID != seed || wc.QPN != a.qp.QPN() {
		t.Fatalf("send completion %+v", wc)
	}
	wantOp := map[WROpcode]WCOpcode{WRSend: WCSend, WRSendImm: WCSend, WRSendInv: WCSend,
		WRWrite: WCRDMAWrite, WRWriteImm: WCRDMAWrite, WRRead: WCRDMARead}[op]
	if wc.Opcode != wantOp {
		t.Fatalf("send completion opcode %v, want %v", wc.Opcode, wantOp)
	}
	if op == WRRead && wc.ByteLen != uint32(size) {
		t.Fatalf("READ byte_len %d, want %d", wc.ByteLen, size)
	}
	if !bytes.Equal(src[:size], dst[:size]) {
		t.Fatalf("%v of %d bytes: data differs", op, size)
	}
	if needRecv {
		r := waitWC(t, b.rcq, 1, 10*time.Second)[0]
		if r.Status != WCSuccess || r.WRID != 77 || r.ByteLen != uint32(size) || r.QPN != b.qp.QPN() || r.SrcQP != a.qp.QPN() {
			t.Fatalf("recv completion %+v (size %d)", r, size)
		}
		switch op {
		case WRSend:
			if r.Opcode != WCRecv || r.Flags != 0 {
				t.Fatalf("recv completion %+v", r)
			}
		case WRSendImm:
			if r.Opcode != WCRecv || r.Flags != WCWithImm || r.Imm != 0xdeadbeef {
				t.Fatalf("recv completion %+v", r)
			}
		case WRWriteImm:
			if r.Opcode != WCRecvRDMAImm || r.Flags != WCWithImm || r.Imm != 0xdeadbeef {
				t.Fatalf("recv completion %+v", r)
			}
		case WRSendInv:
			if r.Opcode != WCRecv || r.Flags != WCWithInv || r.InvalidatedRKey != wr.InvRKey {
				t.Fatalf("recv completion %+v", r)
			}
			if mw.Bound() {
				t.Fatalf("window rkey %#x still bound after SEND with invalidate", wr.InvRKey)
			}
		}
	}
	noWC(t, a.scq)
	noWC(t, b.rcq)
	noWC(t, b.scq)
	noWC(t, a.rcq)
}

// TestAtomics runs compare-and-swap and fetch-and-add and checks the
// returned original values and the target memory.
func TestAtomics(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{retry: 7})
	target, tmr := b.buffer(t, 16, memreg.AccessRemoteAtomic)
	res, rmr := a.buffer(t, 8, 0)
	put := func(v uint64) { nativePut(target[8:], v) }
	get := func(b []byte) uint64 { return nativeGet(b) }
	put(100)
	steps := []struct {
		wr       SendWR
		orig     uint64
		after    uint64
		wcOpcode WCOpcode
	}{
		{SendWR{Opcode: WRFetchAdd, CompareAdd: 5}, 100, 105, WCFetchAdd},
		{SendWR{Opcode: WRCompareSwap, CompareAdd: 7, Swap: 1}, 105, 105, WCCompSwap},
		{SendWR{Opcode: WRCompareSwap, CompareAdd: 105, Swap: 0xffffffffffffffff}, 105, 0xffffffffffffffff, WCCompSwap},
		{SendWR{Opcode: WRFetchAdd, CompareAdd: 2}, 0xffffffffffffffff, 1, WCFetchAdd},
	}
	for i, s := range steps {
		wr := s.wr
		wr.WRID = uint64(i)
		wr.Flags = SendSignaled
		wr.SGEs = sge(rmr, 0, 8)
		wr.RemoteAddr = tmr.IOVA() + 8
		wr.RKey = tmr.RKey()
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		wc := waitWC(t, a.scq, 1, 5*time.Second)[0]
		if wc.Status != WCSuccess || wc.Opcode != s.wcOpcode || wc.ByteLen != 8 {
			t.Fatalf("step %d: %+v", i, wc)
		}
		if got := get(res); got != s.orig {
			t.Fatalf("step %d: orig %#x, want %#x", i, got, s.orig)
		}
		if got := get(target[8:]); got != s.after {
			t.Fatalf("step %d: memory %#x, want %#x", i, got, s.after)
		}
	}
}
