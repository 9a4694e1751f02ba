package transport

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestZeroCopyReadThenSendInv: a requester READs through a type 2 window
// of the responder and then sends a SEND with Invalidate of that window on
// the same QP. The responder executes requests in PSN order, so the READ
// was answered before the window went: it must complete with the data,
// as it does with CopySend and on rxe (whose responder sends a READ's
// last response before it takes the next request). With zero-copy the
// READ's responses were still queued (views of the window) when the
// invalidation ran; they were then dropped at the send (zero_copy_dropped)
// and the READ failed with a remote access error after a retry (probe
// lib26/rcache: a revoked window left clients with flushes instead of the
// access error). The responder now sends what its QP has queued before it
// invalidates (SEND with Invalidate, LOCAL_INV).
func TestZeroCopyReadThenSendInv(t *testing.T) {
	for _, size := range []int{8 << 10, 256 << 10} { // one quantum; several, in scheduler turns
		for _, copySend := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dKiB/copy=%v", size>>10, copySend), func(t *testing.T) {
				testReadThenInv(t, size, copySend, false)
			})
		}
	}
}

// TestZeroCopyReadThenLocalInv: the responder's own LOCAL_INV, posted
// while a long READ through the window is answered (its first quantum
// sent, the rest in scheduler turns). The send queue is not ordered with
// the responder, so the READ may fail with a remote access error, as on
// rxe (which rechecks the key for each response packet) — but the
// responses built before the invalidation must leave, not be dropped:
// dropped, they made the requester go back and, when a later request had
// failed on the window meanwhile (the responder in ERR), left it with no
// access error at all, only flushes (probe lib26/rcache, mode mw2).
func TestZeroCopyReadThenLocalInv(t *testing.T) {
	testReadThenInv(t, 256<<10, false, true)
}

func testReadThenInv(t *testing.T, size int, copySend, local bool) {
	for round := 0; round < 10; round++ {
		n := memnet.NewMemNetwork(memnet.Faults{})
		// The ACK timeout is 268 ms and retry_cnt 7: with the fix no
		// timer expires, so the timeout is a hang guard; without it the
		// requester resends the READ after one timeout and fails all
		// the same. It was ~1 ms with 3 retries: under -race on a
		// loaded machine the responses of a 256 KiB READ, in scheduler
		// turns, came more than a millisecond apart four times in a row
		// and the READ failed with "retry counter exceeded".
		o := pairOpts{mtu: MTU4096, timeout: 16, retry: 7}
		o.defaults()
		a := newSide(t, n, addrA, &o)
		bl := newGatedZCLink(t, n, addrB, nil)
		b := newSideOn(t, bl, &o)
		b.dev.zc = b.dev.zc && !copySend
		connect(t, a, b, addrB, 0x10, 0x20, &o)
		connect(t, b, a, addrA, 0x20, 0x10, &o)
		dst, dmr := a.buffer(t, size, 0)
		src, smr := b.buffer(t, size, memreg.AccessRemoteRead|memreg.AccessMWBind)
		fill(src, uint64(round))
		mw, err := b.pd.AllocMW(memreg.MWType2)
		if err != nil {
			t.Fatal(err)
		}
		key := mw.RKey()&^0xff | 0x5a
		if err := b.qp.PostSend(SendWR{WRID: 1, Opcode: WRBindMW, Flags: SendSignaled, MW: mw, RKey: key,
			Bind: MWBindInfo{MR: smr, Addr: smr.IOVA(), Length: uint64(size), Access: memreg.AccessRemoteRead}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, b.scq, 1, 5*time.Second)[0]; wc.Status != WCSuccess {
			t.Fatalf("bind: %v", wc.Status)
		}
		if err := b.qp.PostRecv(RecvWR{WRID: 2}); err != nil {
			t.Fatal(err)
		}
		before := b.dev.Counters()
		wrs := []SendWR{{WRID: 3, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size), RemoteAddr: smr.IOVA(), RKey: mw.RKey()}}
		if !local {
			wrs = append(wrs, SendWR{WRID: 4, Opcode: WRSendInv, Flags: SendSignaled, InvRKey: mw.RKey()})
		}
		if err := a.qp.PostSend(wrs...); err != nil {
			t.Fatal(err)
		}
		if local {
			// Once the READ is under way at the responder.
			deadline := time.Now().Add(5 * time.Second)
			for b.dev.Counters().SentPkts == before.SentPkts && time.Now().Before(deadline) {
				time.Sleep(10 * time.Microsecond)
			}
			if err := b.qp.PostSend(SendWR{WRID: 5, Opcode: WRLocalInv, Flags: SendSignaled, InvRKey: mw.RKey()}); err != nil {
				t.Fatal(err)
			}
		}
		wcs := waitWC(t, a.scq, len(wrs), 10*time.Second)
		after := b.dev.Counters()
		dropped := after.ZeroCopyDropped - before.ZeroCopyDropped
		if local {
			if dropped != 0 || (wcs[0].Status != WCSuccess && wcs[0].Status != WCRemAccessErr) {
				t.Fatalf("round %d: READ %v, responder zero_copy_dropped +%d (want 0)", round, wcs[0].Status, dropped)
			}
			waitWC(t, b.scq, 1, 5*time.Second)
			continue
		}
		for _, wc := range wcs {
			if wc.Status != WCSuccess {
				t.Fatalf("round %d: wr %d: %v (responder zero_copy_dropped +%d)", round, wc.WRID, wc.Status, dropped)
			}
		}
		if !bytes.Equal(dst, src) {
			t.Fatalf("round %d: the READ returned other bytes", round)
		}
		if !local {
			if wc := waitWC(t, b.rcq, 1, 5*time.Second)[0]; wc.Status != WCSuccess || wc.Flags&WCWithInv == 0 {
				t.Fatalf("SEND with Invalidate at the responder: %+v", wc)
			}
		}
		if mw.Bound() {
			t.Errorf("the window is still bound")
		}
	}
}
