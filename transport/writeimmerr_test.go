package transport

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
)

// TestWriteImmRKeyErrorCompletesRecv: an RC RDMA WRITE with immediate
// whose rkey check fails at the responder. rxe 6.1 takes the receive WQE
// for the packet carrying the immediate (check_resource, RXE_RWR_MASK)
// before it checks the rkey, and its class C error completes that WQE
// with IB_WC_REM_ACCESS_ERR (do_complete); the QP then goes to ERR and
// the WQEs behind it are flushed. We flushed the first WQE too
// (WCWRFlushErr). A multi-packet WRITE whose FIRST packet (no immediate,
// no WQE taken) fails its rkey flushes every WQE, in rxe as here. The
// requester's WRITE completes with the NAK's remote access error.
func TestWriteImmRKeyErrorCompletesRecv(t *testing.T) {
	for _, tc := range []struct {
		size      int
		wantFirst WCStatus
	}{
		{100, WCRemAccessErr}, // WRITE ONLY with immediate: the WQE is taken
		{3000, WCWRFlushErr},  // WRITE FIRST fails: no WQE taken yet
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			a, b, _ := newPair(t, pairOpts{})
			src, smr := a.buffer(t, tc.size, 0)
			fill(src, 3)
			_, dmr := b.buffer(t, tc.size, memreg.AccessRemoteWrite)
			for i := range 2 {
				if err := b.qp.PostRecv(RecvWR{WRID: uint64(10 + i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRWriteImm, Flags: SendSignaled, Imm: 7,
				SGEs: sge(smr, 0, tc.size), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey() ^ 0x100}); err != nil {
				t.Fatal(err)
			}
			if wc := waitWC(t, a.scq, 1, 10*time.Second)[0]; wc.WRID != 1 || wc.Status != WCRemAccessErr {
				t.Errorf("requester: %+v, want remote access error", wc)
			}
			r := waitWC(t, b.rcq, 2, 10*time.Second)
			if r[0].WRID != 10 || r[0].Status != tc.wantFirst || r[0].QPN != b.qp.QPN() {
				t.Errorf("responder's first receive: %+v, want wr_id 10 %v", r[0], tc.wantFirst)
			}
			if r[1].WRID != 11 || r[1].Status != WCWRFlushErr {
				t.Errorf("responder's second receive: %+v, want wr_id 11 flushed", r[1])
			}
			if st := b.qp.State(); st != QPSErr {
				t.Errorf("responder QP state %v, want ERR", st)
			}
		})
	}
}
