package transport

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// flightLink is a responder's link that plays a slow peer's READ response
// flights: it counts how often each response PSN was sent (its flight, 1
// for the answer to the original request), drops those drop picks, holds
// the first flight's responses beyond gap (the stale remainder, sent by
// releaseStale a few at a time) and, while holding, the later flights' (sent
// by releaseLater: rxe's responder answers a re-request only after the
// flight it is sending).
type flightLink struct {
	udp.Wrap
	mu      sync.Mutex
	first   bth.PSN
	gap     int
	drop    func(k, flight int) bool
	seen    map[int]int
	sent1   int // first-flight responses the responder sent
	holding bool
	stale   []udp.Packet
	later   []udp.Packet
}

func (l *flightLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	keep := make([]udp.Packet, 0, len(pkts))
	var p packet.Packet
	for _, up := range pkts {
		if err := p.Parse(up.Buf); err != nil || p.Info.Kind != bth.KindReadResponse {
			keep = append(keep, up)
			continue
		}
		k := int(p.BTH.PSN().Diff(l.first))
		l.seen[k]++
		n := l.seen[k]
		if n == 1 {
			l.sent1++
		}
		c := up
		c.Buf = append([]byte(nil), up.Buf...)
		switch {
		case l.drop(k, n):
		case n == 1 && k > l.gap:
			l.stale = append(l.stale, c)
		case n > 1 && l.holding:
			l.later = append(l.later, c)
		default:
			keep = append(keep, up)
		}
	}
	l.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

// releaseStale sends the next m held stale responses; it returns how many
// it sent.
func (l *flightLink) releaseStale(m int) int {
	l.mu.Lock()
	m = min(m, len(l.stale))
	out := l.stale[:m]
	l.stale = l.stale[m:]
	l.mu.Unlock()
	if m > 0 {
		if err := l.Link.Send(out); err != nil {
			panic(err)
		}
	}
	return m
}

// releaseLater stops holding and sends the later flights held so far.
func (l *flightLink) releaseLater() {
	l.mu.Lock()
	out := l.later
	l.later, l.holding = nil, false
	l.mu.Unlock()
	if len(out) > 0 {
		if err := l.Link.Send(out); err != nil {
			panic(err)
		}
	}
}

// staleReadPair connects a (the READ requester) and b over a MemNetwork,
// b's sends through a flightLink, on a ManualClock.
func staleReadPair(t *testing.T, o pairOpts, l *flightLink) (a, b *side) {
	t.Helper()
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	ra, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	l.Wrap = udp.Wrap{Link: rb}
	a, b = sideOn(t, ra, &o), sideOn(t, l, &o)
	connect(t, a, b, addrB, uint32(l.first), 0x100, &o)
	connect(t, b, a, addrA, 0x100, uint32(l.first), &o)
	return a, b
}

// rcvdOrErr waits until a handled want packets or its QP left RTS.
func rcvdOrErr(t *testing.T, a *side, want uint64) {
	t.Helper()
	eventually(t, "the released READ responses", func() bool {
		return a.dev.Counters().RcvdPkts >= want || a.qp.State() != QPSRTS
	})
}

// An 8 MiB READ (2048 responses at MTU 4096) from a slow peer, as rxe in
// the lab's TCG VM: the responder's first flight loses its 6th response;
// the remaining 2042 (stale once the requester re-requested from the gap)
// keep arriving for 12 ACK timeouts; only then does the peer answer the
// re-request, and that flight and the next lose a response each. Every
// ACK timer expiry during the stale stream must be excused
// (ack_timeout_busy): before, each spent a retry and retry_cnt 7 ran out
// after 7 timeouts (transport retry counter exceeded), with the peer
// visibly busy. The requester re-requests once, not at every expiry.
func TestReadStaleFlightSpendsNoRetry(t *testing.T) { testReadStaleFlight(t, false) }

// The same with selective repeat: the stale responses are new data there
// (placed out of order), and each new one counts as progress for the
// retry count; before, the full timeouts without in-order progress spent
// retry_cnt 7 after 7 timeouts.
func TestReadStaleFlightSR(t *testing.T) { testReadStaleFlight(t, true) }

func testReadStaleFlight(t *testing.T, sr bool) {
	clk := manual()
	const size, mtu = 8 << 20, 4096
	const npkts = size / mtu
	const gap, gap2, gap3 = 5, 1000, 1500
	l := &flightLink{first: 0xfffff0, gap: gap, seen: map[int]int{}, holding: true,
		drop: func(k, n int) bool { return (k == gap && n == 1) || (k == gap2 && n == 2) || (k == gap3 && n == 3) }}
	a, b := staleReadPair(t, pairOpts{clock: clk, mtu: MTU4096, retry: 7, timeout: 14, sr: sr}, l)
	to := a.qp.timeout
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	fill(src, 27)
	dst, dmr := a.buffer(t, size, memreg.AccessLocalWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first response flight", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.sent1 == npkts })
	rcvd := uint64(gap)
	rcvdOrErr(t, a, rcvd)
	// The stale remainder: 24 chunks, half a timeout apart.
	const chunks = 24
	per := (npkts - gap - 1 + chunks - 1) / chunks
	for i := 0; i < chunks; i++ {
		rcvd += uint64(l.releaseStale(per))
		rcvdOrErr(t, a, rcvd)
		clk.Advance(to / 2)
		if st := a.qp.State(); st != QPSRTS {
			c := a.dev.Counters()
			t.Fatalf("QP %v after %d half timeouts of stale READ responses (local_ack_timeout_err %d, retry_exceeded_err %d, ack_timeout_busy %d)",
				st, i+1, c.LocalAckTimeout, c.RetryExceededErr, c.AckTimeoutBusy)
		}
	}
	if c := a.dev.Counters(); sr && c.RetryExceededErr != 0 {
		t.Fatalf("retry_exceeded_err %d", c.RetryExceededErr)
	}
	if c := a.dev.Counters(); !sr && (c.AckTimeoutBusy < 8 || c.LocalAckTimeout != 0) {
		t.Fatalf("during 12 timeouts of stale responses: ack_timeout_busy %d, local_ack_timeout_err %d; want ≥ 8 and 0",
			c.AckTimeoutBusy, c.LocalAckTimeout)
	}
	if d := b.dev.Counters().DuplicateRequest; !sr && d != 1 {
		t.Fatalf("the responder saw %d re-requests during the stale stream, want 1", d)
	}
	l.releaseLater()
	wc := waitWC(t, a.scq, 1, 30*time.Second)
	if wc[0].Status != WCSuccess {
		c := a.dev.Counters()
		t.Fatalf("READ: %v (local_ack_timeout_err %d, ack_timeout_busy %d)", wc[0].Err(), c.LocalAckTimeout, c.AckTimeoutBusy)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("READ data differs")
	}
	if c := a.dev.Counters(); c.RetryExceededErr != 0 || (!sr && c.LocalAckTimeout != 0) {
		t.Fatalf("local_ack_timeout_err %d, retry_exceeded_err %d; want 0 (the three losses cost a go-back-N each)", c.LocalAckTimeout, c.RetryExceededErr)
	}
}

// A peer that keeps sending the stale remainder of a READ's flight and
// never answers the re-request is still found: each retry excuses at most
// maxBusyRun expiries, so with retry_cnt 2 the READ fails with retry
// exceeded after 2 × maxBusyRun excused expiries and 2 spent ones (the
// gap itself spent the first retry).
func TestReadStaleFlightForeverFails(t *testing.T) {
	clk := manual()
	const size, mtu = 8 << 20, 4096
	const npkts = size / mtu
	const gap = 5
	l := &flightLink{first: 0x10, gap: gap, seen: map[int]int{}, holding: true,
		drop: func(k, n int) bool { return (k == gap && n == 1) || n > 1 }}
	a, b := staleReadPair(t, pairOpts{clock: clk, mtu: MTU4096, retry: 2, timeout: 14}, l)
	to := a.qp.timeout
	_, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	_, dmr := a.buffer(t, size, memreg.AccessLocalWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first response flight", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.sent1 == npkts })
	rcvd := uint64(gap)
	rcvdOrErr(t, a, rcvd)
	steps := 0
	for ; steps < npkts-gap-1 && a.qp.State() == QPSRTS; steps++ {
		rcvd += uint64(l.releaseStale(1))
		rcvdOrErr(t, a, rcvd)
		clk.Advance(to / 2)
	}
	var wc [1]WC
	eventually(t, "the READ's completion", func() bool { return a.scq.Poll(wc[:]) == 1 })
	c := a.dev.Counters()
	if wc[0].Status != WCRetryExcErr || c.AckTimeoutBusy != 2*maxBusyRun || c.LocalAckTimeout != 2 {
		t.Fatalf("after %d half timeouts: %v, ack_timeout_busy %d, local_ack_timeout_err %d; want retry exceeded, %d, 2",
			steps, wc[0].Status, c.AckTimeoutBusy, c.LocalAckTimeout, 2*maxBusyRun)
	}
}
