package transport

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestManyQPs runs 8 connected QP pairs between two devices at once, with
// 1% loss, each moving WRITEs and SENDs; the device demultiplexes by QPN.
func TestManyQPs(t *testing.T) {
	o := pairOpts{mtu: MTU1024, timeout: 13, retry: 7, rnrRetry: 7}
	if raceEnabled {
		o.timeout = 16 // 268 ms: the race detector on a loaded 2-core machine starves the loss recovery
	}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{Loss: 0.01, Seed: 9})
	a := newSide(t, n, addrA, &o)
	b := newSide(t, n, addrB, &o)
	const pairs = 8
	var wg sync.WaitGroup
	errs := make(chan error, pairs)
	for i := 0; i < pairs; i++ {
		scq, _ := a.dev.CreateCQ(64)
		qa, err := a.dev.CreateQP(a.pd, QPInitAttr{Type: QPTypeRC, SendCQ: scq, RecvCQ: a.rcq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		rcq, _ := b.dev.CreateCQ(64)
		qb, err := b.dev.CreateQP(b.pd, QPInitAttr{Type: QPTypeRC, SendCQ: b.scq, RecvCQ: rcq, MaxSendWR: 16, MaxRecvWR: 16})
		if err != nil {
			t.Fatal(err)
		}
		sa, sb := &side{dev: a.dev, pd: a.pd, scq: scq, qp: qa}, &side{dev: b.dev, pd: b.pd, rcq: rcq, qp: qb}
		connect(t, sa, sb, addrB, uint32(i*1000), uint32(i*7777), &o)
		connect(t, sb, sa, addrA, uint32(i*7777), uint32(i*1000), &o)
		src, smr := sa.buffer(t, 200000, 0)
		fill(src, uint64(i))
		dst, dmr := sb.buffer(t, 200000, memreg.AccessRemoteWrite)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 20; k++ {
				clear(dst)
				if err := sb.qp.PostRecv(RecvWR{WRID: uint64(k), SGEs: sge(dmr, 100000, 100000)}); err != nil {
					errs <- err
					return
				}
				if err := sa.qp.PostSend(
					SendWR{WRID: uint64(2 * k), Opcode: WRWrite, SGEs: sge(smr, 0, 100000), RemoteAddr: dmr.IOVA(), RKey: dmr.RKey()},
					SendWR{WRID: uint64(2*k + 1), Opcode: WRSend, Flags: SendSignaled, SGEs: sge(smr, 100000, 100000)},
				); err != nil {
					errs <- err
					return
				}
				wc, err := waitOne(sa.scq, 20*time.Second)
				if err != nil {
					errs <- fmt.Errorf("pair %d: %w", i, err)
					return
				}
				if wc.Status != WCSuccess || wc.WRID != uint64(2*k+1) || wc.QPN != sa.qp.QPN() {
					errs <- fmt.Errorf("pair %d: %+v", i, wc)
					return
				}
				rw, err := waitOne(sb.rcq, 20*time.Second)
				if err != nil {
					errs <- fmt.Errorf("pair %d: recv: %w", i, err)
					return
				}
				if rw.Status != WCSuccess || rw.WRID != uint64(k) || rw.QPN != sb.qp.QPN() {
					errs <- fmt.Errorf("pair %d: recv %+v", i, rw)
					return
				}
				if !bytes.Equal(src, dst) {
					errs <- fmt.Errorf("pair %d round %d: data differs", i, k)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// waitOne waits for one completion without failing the test (usable from
// any goroutine).
func waitOne(cq *CQ, d time.Duration) (WC, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]WC
	_, err := cq.Wait(ctx, wc[:])
	return wc[0], err
}
