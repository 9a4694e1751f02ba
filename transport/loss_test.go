package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// mixOp is one message kind of the loss-matrix workload.
type mixOp struct {
	op   WROpcode
	size int
}

var lossMix = []mixOp{
	{WRWrite, 256 << 10},
	{WRRead, 256 << 10},
	{WRSend, 64 << 10},
	{WRWriteImm, 100<<10 + 13},
	{WRSendImm, 4095},
	{WRFetchAdd, 8},
	{WRRead, 1},
	{WRSend, 0},
	{WRCompareSwap, 8},
	{WRWrite, 33},
}

const (
	lossSlots    = 16
	lossSlotSize = 256 << 10
)

// pattern fills b with a pattern unique to message id.
func pattern(b []byte, id uint64) {
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], id<<32|uint64(i))
		copy(b[i:], w[:])
	}
}

// direction drives messages from requester x to responder y and verifies
// every byte and completion.
type direction struct {
	x, y            *side
	xsrc, xdst      []byte
	xsrcMR, xdstMR  *memreg.MR
	ysrc, ydst      []byte
	ysrcMR, ydstMR  *memreg.MR
	ctr, xres       []byte
	ctrMR, xresMR   *memreg.MR
	bytes           int64
	faddN, cswapVal uint64
}

func newDirection(t testing.TB, x, y *side) *direction {
	d := &direction{x: x, y: y}
	n := lossSlots * lossSlotSize
	d.xsrc, d.xsrcMR = x.buffer(t, n, 0)
	d.xdst, d.xdstMR = x.buffer(t, n, 0)
	d.ysrc, d.ysrcMR = y.buffer(t, n, memreg.AccessRemoteRead)
	d.ydst, d.ydstMR = y.buffer(t, n, memreg.AccessRemoteWrite)
	d.ctr, d.ctrMR = y.buffer(t, 16, memreg.AccessRemoteAtomic)
	d.xres, d.xresMR = x.buffer(t, 8*lossSlots, 0)
	return d
}

type inflight struct {
	id   uint64
	m    mixOp
	slot int
	want uint64 // atomics: expected orig
}

func (d *direction) run(ctx context.Context, total int64) error {
	var q []inflight
	var id uint64
	wc := make([]WC, 32)
	rwc := make([]WC, 1)
	var recvWant []uint64
	post := func() error {
		m := lossMix[id%uint64(len(lossMix))]
		slot := int(id % lossSlots)
		off := slot * lossSlotSize
		f := inflight{id: id, m: m, slot: slot}
		wr := SendWR{WRID: id, Opcode: m.op, Flags: SendSignaled}
		switch m.op {
		case WRFetchAdd:
			wr.SGEs = sge(d.xresMR, slot*8, 8)
			wr.RemoteAddr, wr.RKey, wr.CompareAdd = d.ctrMR.IOVA(), d.ctrMR.RKey(), 1
			f.want = d.faddN
			d.faddN++
		case WRCompareSwap:
			wr.SGEs = sge(d.xresMR, slot*8, 8)
			wr.RemoteAddr, wr.RKey = d.ctrMR.IOVA()+8, d.ctrMR.RKey()
			wr.CompareAdd, wr.Swap = d.cswapVal, d.cswapVal+3
			f.want = d.cswapVal
			d.cswapVal += 3
		case WRRead:
			pattern(d.ysrc[off:off+m.size], id)
			clear(d.xdst[off : off+m.size])
			wr.SGEs = sge(d.xdstMR, off, m.size)
			wr.RemoteAddr, wr.RKey = d.ysrcMR.IOVA()+uint64(off), d.ysrcMR.RKey()
		default:
			pattern(d.xsrc[off:off+m.size], id)
			clear(d.ydst[off : off+m.size])
			wr.SGEs = sge(d.xsrcMR, off, m.size)
			wr.RemoteAddr, wr.RKey = d.ydstMR.IOVA()+uint64(off), d.ydstMR.RKey()
			wr.Imm = uint32(id)
			switch m.op {
			case WRSend, WRSendImm:
				if err := d.y.qp.PostRecv(RecvWR{WRID: id, SGEs: sge(d.ydstMR, off, lossSlotSize)}); err != nil {
					return err
				}
				recvWant = append(recvWant, id)
			case WRWriteImm:
				if err := d.y.qp.PostRecv(RecvWR{WRID: id}); err != nil {
					return err
				}
				recvWant = append(recvWant, id)
			}
		}
		if err := d.x.qp.PostSend(wr); err != nil {
			return err
		}
		q = append(q, f)
		id++
		return nil
	}
	var sent int64
	for {
		for len(q) < lossSlots && sent < total {
			m := lossMix[id%uint64(len(lossMix))]
			if err := post(); err != nil {
				return err
			}
			sent += int64(m.size)
		}
		if len(q) == 0 {
			return nil
		}
		n, err := d.x.scq.Wait(ctx, wc)
		if err != nil {
			return fmt.Errorf("waiting for wr %d (posted %d): %w", q[0].id, id, err)
		}
		for _, c := range wc[:n] {
			f := q[0]
			q = q[1:]
			if c.WRID != f.id || c.Status != WCSuccess {
				return fmt.Errorf("completion %+v, want wr %d success", c, f.id)
			}
			off := f.slot * lossSlotSize
			sz := f.m.size
			switch f.m.op {
			case WRFetchAdd, WRCompareSwap:
				if got := nativeGet(d.xres[f.slot*8:]); got != f.want {
					return fmt.Errorf("wr %d %v: orig %d, want %d", f.id, f.m.op, got, f.want)
				}
			case WRRead:
				if string(d.xdst[off:off+sz]) != string(d.ysrc[off:off+sz]) {
					return fmt.Errorf("wr %d READ %d bytes: data differs", f.id, sz)
				}
			default:
				if string(d.ydst[off:off+sz]) != string(d.xsrc[off:off+sz]) {
					return fmt.Errorf("wr %d %v %d bytes: data differs", f.id, f.m.op, sz)
				}
			}
			if f.m.op == WRSend || f.m.op == WRSendImm || f.m.op == WRWriteImm {
				if d.y.rcq.Poll(rwc) != 1 {
					return fmt.Errorf("wr %d: no receive completion", f.id)
				}
				r := rwc[0]
				if len(recvWant) == 0 || r.WRID != recvWant[0] || r.Status != WCSuccess || r.ByteLen != uint32(sz) {
					return fmt.Errorf("wr %d: receive completion %+v", f.id, r)
				}
				if f.m.op != WRSend && (r.Imm != uint32(f.id) || r.Flags&WCWithImm == 0) {
					return fmt.Errorf("wr %d: receive completion %+v lacks imm", f.id, r)
				}
				recvWant = recvWant[1:]
			}
			d.bytes += int64(sz)
		}
	}
}

func lossBytes() int64 {
	if s := os.Getenv("ROCEV2_LOSS_MIB"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return int64(n) << 20
		}
	}
	if raceEnabled || testing.Short() {
		return 8 << 20
	}
	return 64 << 20
}

// TestLossMatrix moves at least 64 MiB (8 MiB under -race or -short;
// ROCEV2_LOSS_MIB overrides) of mixed operations, half in each direction,
// through a MemNetwork with seeded faults, and checks every byte, every
// completion exactly once and in order, the atomics' exactly-once results,
// a time bound, and that the counters show the recovery work.
type lossCase struct {
	name string
	f    memnet.Faults
	mtu  MTU
}

var lossCases = []lossCase{
	{"clean", memnet.Faults{}, MTU4096},
	{"loss0.1%", memnet.Faults{Loss: 0.001}, MTU4096},
	{"loss1%", memnet.Faults{Loss: 0.01}, MTU4096},
	{"loss5%", memnet.Faults{Loss: 0.05}, MTU4096},
	{"loss10%", memnet.Faults{Loss: 0.10}, MTU4096},
	{"reorder5%", memnet.Faults{Reorder: 0.05}, MTU4096},
	{"dup5%", memnet.Faults{Dup: 0.05}, MTU4096},
	{"corrupt2%", memnet.Faults{Corrupt: 0.02}, MTU4096},
	{"mixed-mtu1024", memnet.Faults{Loss: 0.01, Reorder: 0.01, Dup: 0.01, Corrupt: 0.01}, MTU1024},
}

// gbnMaxLoss is the heaviest random loss the go-back-N runs of the loss
// cases use; a case with more (loss10%) runs at this rate without
// selective repeat (gbnCase), and at its own with it (TestLossMatrixSR).
//
// Under go-back-N a QP gives up (retry exceeded, as retry_cnt 7 tells it
// to) after 8 retries in a row that made no progress, and at 10 % loss a
// retry makes none about one time in five: its first packet, or the
// response or NAK it draws, is lost (a responder NAKs a gap once, so
// the rest of the flight is dropped silently until the next timeout), and
// a READ's retry needs both its request and its first response through.
// Counted over 8 runs of the 64 MiB case at 10 % (~1,300 retries per
// run): 9,484 retries left 6 tries, 999 left 5, 132 left 4, 26 left 3, 5
// left 2, 2 left 1 and 1 left none — the next in a row fails the QP, as
// the IB spec says it must, in a few runs in a hundred (CI saw one,
// 12-06). At 7 %, 8 runs: 7,249, 443, 57, 8, 1, 0, 0: each step down is
// rarer and the chain dies out about three steps earlier.
const gbnMaxLoss = 0.07

// gbnCase returns c as the go-back-N runs use it: loss above gbnMaxLoss
// capped, and the name saying so.
func gbnCase(c lossCase) lossCase {
	if c.f.Loss > gbnMaxLoss {
		c.name = fmt.Sprintf("loss%g%%", 100*gbnMaxLoss)
		c.f.Loss = gbnMaxLoss
	}
	return c
}

func TestLossMatrix(t *testing.T) {
	total := lossBytes()
	for i, c := range lossCases {
		c := gbnCase(c)
		t.Run(c.name, func(t *testing.T) {
			c.f.Seed = int64(1000 + i)
			// Timeout 14 (67 ms, the tools' default): (retry_cnt+1) x 67 ms
			// ~ 0.5 s of tolerated no-progress, enough for the receive-loop
			// stalls seen when CI runs packages in parallel on 2 cores
			// (~460 ms observed under artificial load with timeout 13).
			runLossCase(t, c, total, 60*time.Second, 14)
		})
	}
}

// BenchmarkLossMatrix1GiB is the soak version of TestLossMatrix: 1 GiB per
// case (ROCEV2_LOSS_MIB overrides). Run with -bench LossMatrix -benchtime 1x;
// not part of CI.
func BenchmarkLossMatrix1GiB(b *testing.B) {
	total := int64(1 << 30)
	if s := os.Getenv("ROCEV2_LOSS_MIB"); s != "" {
		total = lossBytes()
	}
	for i, c := range lossCases {
		c := gbnCase(c)
		b.Run(c.name, func(b *testing.B) {
			c.f.Seed = int64(2000 + i)
			b.SetBytes(total)
			for k := 0; k < b.N; k++ {
				runLossCase(b, c, total, 30*time.Minute, 14)
			}
		})
	}
}

// runLossCase moves total bytes of mixed operations, half in each
// direction, under the case's faults and checks everything.
func runLossCase(t testing.TB, c lossCase, total int64, limit time.Duration, timeout uint8) {
	t.Helper()
	runLossCaseMode(t, c, false, total, limit, timeout)
}

// runLossCaseMode is runLossCase with selective repeat on both QPs when
// sr is set (sack_test.go).
func runLossCaseMode(t testing.TB, c lossCase, sr bool, total int64, limit time.Duration, timeout uint8) {
	t.Helper()
	runLossCaseSR(t, c, sr, SRConfig{}, total, limit, timeout)
}

// runLossCaseSR is runLossCaseMode with srCfg as both devices' selective
// repeat settings.
func runLossCaseSR(t testing.TB, c lossCase, sr bool, srCfg SRConfig, total int64, limit time.Duration, timeout uint8) {
	t.Helper()
	// Local ACK timeout: the caller's (14 = 67 ms in CI and the soak).
	// Retries must survive the
	// scheduling stalls of a loaded 2-core machine: (retry_cnt+1) × the
	// timeout is how long a QP tolerates no progress at all (measured:
	// receive-loop stalls of 30-100 ms when the machine is overloaded,
	// which exhausted retries with 4 ms and 16.8 ms timeouts).
	to := timeout
	a, b, n := newPair(t, pairOpts{faults: c.f, mtu: c.mtu, timeout: to, retry: 7, rnrRetry: 7, sqDepth: 64, rqDepth: 64, sr: sr, srCfg: srCfg})
	if a.qp.SelectiveRepeat() != sr || b.qp.SelectiveRepeat() != sr {
		t.Fatalf("selective repeat %v/%v, want %v", a.qp.SelectiveRepeat(), b.qp.SelectiveRepeat(), sr)
	}
	ab := newDirection(t, a, b)
	ba := newDirection(t, b, a)
	var ta, tb traceRing
	if os.Getenv("ROCEV2_TRACE") != "" {
		a.qp.trace, b.qp.trace = ta.add, tb.add
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for k, d := range []*direction{ab, ba} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[k] = d.run(ctx, total/2)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	for _, err := range errs {
		if err != nil {
			if os.Getenv("ROCEV2_TRACE") != "" {
				os.WriteFile("/tmp/traceA.txt", []byte(ta.dump()), 0o644)
				os.WriteFile("/tmp/traceB.txt", []byte(tb.dump()), 0o644)
			}
			if os.Getenv("ROCEV2_TRACE") != "" {
				pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
			}
			t.Logf("recv loop: A max wait %v max busy %v (%d pkts); B max wait %v max busy %v (%d pkts)",
				time.Duration(a.dev.rx.stats.maxWait.Load()), time.Duration(a.dev.rx.stats.maxBusy.Load()), a.dev.rx.stats.maxBusyN.Load(),
				time.Duration(b.dev.rx.stats.maxWait.Load()), time.Duration(b.dev.rx.stats.maxBusy.Load()), b.dev.rx.stats.maxBusyN.Load())
			t.Fatalf("after %v: %v\nA %+v\nB %+v\nnet %+v\nlinks A %+v B %+v\nA: %s\nB: %s", el, err, a.dev.Counters(), b.dev.Counters(), n.Counters(),
				a.dev.Link().Stats(), b.dev.Link().Stats(), a.qp.debugState(), b.qp.debugState())

		}
	}
	if ab.bytes+ba.bytes < total {
		t.Fatalf("moved %d bytes, want %d", ab.bytes+ba.bytes, total)
	}
	ca, cb := a.dev.Counters(), b.dev.Counters()
	retrans := ca.RetransmittedPkts + cb.RetransmittedPkts
	retries := ca.CompleterRetryErr + cb.CompleterRetryErr
	dups := ca.DuplicateRequest + cb.DuplicateRequest
	nc := n.Counters()
	lossRate(t, c, sr, float64(ab.bytes+ba.bytes)/(1<<20)/el.Seconds())
	t.Logf("%d MiB in %v (%.0f MiB/s); net %+v; retransmitted_pkts %d completer_retry_err %d duplicate_request %d out_of_seq_request %d rcvd_seq_err %d local_ack_timeout_err %d bad ICRC A/B %d/%d link queue drops A/B %d/%d",
		(ab.bytes+ba.bytes)>>20, el.Round(time.Millisecond), float64(ab.bytes+ba.bytes)/(1<<20)/el.Seconds(), nc,
		retrans, retries, dups, ca.OutOfSeqRequest+cb.OutOfSeqRequest, ca.RcvdSeqErr+cb.RcvdSeqErr,
		ca.LocalAckTimeout+cb.LocalAckTimeout, a.dev.Link().Stats().DropBadICRC, b.dev.Link().Stats().DropBadICRC, a.dev.Link().Stats().DropOther, b.dev.Link().Stats().DropOther)
	if sr {
		retries += ca.SRRecoveries + cb.SRRecoveries
	}
	if nc.Lost+nc.Reordered+nc.Corrupted > 0 && (retrans == 0 || retries == 0) {
		t.Errorf("faults injected but counters show no retransmission")
	}
	if nc.Duplicated > 0 && dups == 0 {
		t.Errorf("duplicates injected but duplicate_request is 0")
	}
	if nc.Corrupted > 0 && a.dev.Link().Stats().DropBadICRC+b.dev.Link().Stats().DropBadICRC == 0 {
		t.Errorf("corruption injected but no ICRC drops")
	}
	if got := nativeGet(ab.ctr); got != ab.faddN {
		t.Errorf("fetch-add counter %d, want %d (exactly once)", got, ab.faddN)
	}
	if got := nativeGet(ab.ctr[8:]); got != ab.cswapVal {
		t.Errorf("compare-swap value %d, want %d (exactly once)", got, ab.cswapVal)
	}
	if a.qp.State() != QPSRTS || b.qp.State() != QPSRTS {
		t.Errorf("states %v %v", a.qp.State(), b.qp.State())
	}
	checkLossCounters(t, c, sr, nc, ca, cb, a.dev.Link().Stats().DropOther+b.dev.Link().Stats().DropOther)
	// Every completion was consumed by run, exactly once and in order; the
	// CQs must be empty and stay empty (a late duplicate completion, or a
	// completion for a retransmission, would show up here).
	time.Sleep(min(2*AckTimeout(to), 200*time.Millisecond))
	for _, q := range []struct {
		name string
		cq   *CQ
	}{{"A send", a.scq}, {"A recv", a.rcq}, {"B send", b.scq}, {"B recv", b.rcq}} {
		var left [8]WC
		if k := q.cq.Poll(left[:]); k != 0 {
			t.Errorf("%s CQ holds %d extra completions after the run: %+v", q.name, k, left[:k])
		}
	}
}

// checkLossCounters checks that the counters show what the injected faults
// must have caused, and nothing the faults cannot explain.
func checkLossCounters(t testing.TB, c lossCase, sr bool, nc memnet.MemCounters, ca, cb Counters, queueDrops uint64) {
	t.Helper()
	oos := ca.OutOfSeqRequest + cb.OutOfSeqRequest
	seq := ca.RcvdSeqErr + cb.RcvdSeqErr
	gaps := nc.Lost + nc.Corrupted + nc.Reordered + queueDrops
	if gaps == 0 && (oos != 0 || seq != 0) {
		// Without loss, corruption or reordering no request can arrive
		// ahead of its turn (a timeout retransmission is behind, a
		// duplicate is behind).
		t.Errorf("no packet lost or reordered, yet out_of_seq_request %d rcvd_seq_err %d", oos, seq)
	}
	if c.f.Loss >= 0.01 || c.f.Corrupt >= 0.01 {
		// Hundreds of lost packets, most of them followed by more of
		// the same flight: the responders saw gaps and NAKed them, and
		// (NAKs are lost at the same rate, not all) the requesters got
		// some.
		if nc.Lost+nc.Corrupted < 10 {
			t.Errorf("loss %.3f corrupt %.3f injected only %d faults", c.f.Loss, c.f.Corrupt, nc.Lost+nc.Corrupted)
		}
		if oos == 0 || seq == 0 {
			t.Errorf("under loss: out_of_seq_request %d rcvd_seq_err %d, want both > 0", oos, seq)
		}
		if ca.RetransmittedPkts+cb.RetransmittedPkts == 0 {
			t.Errorf("under loss: retransmitted_pkts 0")
		}
	}
	if nc.Duplicated == 0 {
		// Each PSN sequence NAK is sent once per gap; without duplication a
		// requester cannot receive more than its responder peer sent.
		if sr {
			// Selective repeat answers every held packet with a
			// selective NAK: compare with those.
			if ca.RcvdSeqErr > cb.SRSACKSent+cb.OutOfSeqRequest || cb.RcvdSeqErr > ca.SRSACKSent+ca.OutOfSeqRequest {
				t.Errorf("rcvd_seq_err A %d B %d exceeds the selective NAKs the peer sent B %d A %d", ca.RcvdSeqErr, cb.RcvdSeqErr, cb.SRSACKSent, ca.SRSACKSent)
			}
		} else if ca.RcvdSeqErr > cb.OutOfSeqRequest || cb.RcvdSeqErr > ca.OutOfSeqRequest {
			t.Errorf("rcvd_seq_err A %d B %d exceeds the peer's out_of_seq_request B %d A %d", ca.RcvdSeqErr, cb.RcvdSeqErr, cb.OutOfSeqRequest, ca.OutOfSeqRequest)
		}
	}
	if ca.RetryExceededErr+cb.RetryExceededErr+ca.RetryRNRExceededErr+cb.RetryRNRExceededErr != 0 {
		t.Errorf("retry counters exhausted: %+v %+v", ca, cb)
	}
}

// traceRing keeps the last events of a QP's trace hook.
type traceRing struct {
	t0 time.Time
	ev []string
}

var dumped sync.Once

var traceT0 = time.Now()

func (r *traceRing) add(format string, args ...any) {
	r.t0 = traceT0
	if strings.Contains(format, "retryCnt now") && len(args) == 4 && args[3] == uint8(3) {
		dumped.Do(func() {
			f, _ := os.Create("/tmp/stall-goroutines.txt")
			pprof.Lookup("goroutine").WriteTo(f, 2)
			f.Close()
		})
	}
	r.ev = append(r.ev, fmt.Sprintf("%9.3fms ", float64(time.Since(r.t0).Microseconds())/1000)+fmt.Sprintf(format, args...))
	if len(r.ev) > 4000 {
		r.ev = append(r.ev[:0], r.ev[2000:]...)
	}
}

func (r *traceRing) dump() string {
	ev := r.ev
	if len(ev) > 3000 {
		ev = ev[len(ev)-3000:]
	}
	out := ""
	for _, e := range ev {
		out += e + "\n"
	}
	return out
}
