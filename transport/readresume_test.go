package transport

import (
	"bytes"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// everyNthLink drops every nth READ response its device sends (counted
// over all of them), as the interop cell's "every 1500th response lost".
type everyNthLink struct {
	udp.Wrap
	nth     int
	mu      sync.Mutex
	sent    int
	dropped int
}

func (l *everyNthLink) Send(pkts []udp.Packet) error {
	l.mu.Lock()
	keep := make([]udp.Packet, 0, len(pkts))
	for _, p := range pkts {
		if bth.BTH(p.Buf).Opcode().Info().Kind == bth.KindReadResponse {
			l.sent++
			if l.sent%l.nth == 0 {
				l.dropped++
				continue
			}
		}
		keep = append(keep, p)
	}
	l.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return l.Link.Send(keep)
}

// TestReadResumesFromFirstMissing: a 4 MiB READ (4,096 responses at MTU
// 1024) whose responder loses every 1,500th response it sends. Each loss
// makes the requester ask again for the rest of the READ from the first
// response it is missing — the new READ request's PSN is that response's,
// its VA and length the remainder's (IB 9.7.5.1; rxe's req_retry does the
// same, from the bytes received) — so every flight makes progress and the
// READ completes; the retry count (1 here) is restored by each in-order
// response, as rxe's check_ack does (reset_retry_counters), so repeated
// partial losses do not exhaust it. A READ restarted from its start
// would lose a response in every 4,096-packet flight and never finish.
func TestReadResumesFromFirstMissing(t *testing.T) {
	const size, mtu, nth = 4 << 20, 1024, 1500
	const npkts = size / mtu
	clk := manual()
	o := pairOpts{clock: clk, mtu: MTU1024, retry: 1, timeout: 14}
	o.defaults()
	n := memnet.NewMemNetwork(memnet.Faults{})
	la, err := n.Link(addrA)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := n.Link(addrB)
	if err != nil {
		t.Fatal(err)
	}
	drop := &everyNthLink{Wrap: udp.Wrap{Link: lb}, nth: nth}
	a, b := sideOn(t, la, &o), sideOn(t, drop, &o)
	const first = 0xfffff0 // the READ's PSNs wrap
	connect(t, a, b, addrB, first, 0x100, &o)
	connect(t, b, a, addrA, 0x100, first, &o)
	// The READ requests A sends: PSN, VA, DMA length.
	type req struct {
		psn bth.PSN
		va  uint64
		n   uint32
	}
	var mu sync.Mutex
	var reqs []req
	n.SetTap(func(src, _ netip.Addr, _ uint16, _ uint8, pl []byte) {
		var p packet.Packet
		if src != addrA || p.Parse(pl) != nil || p.Info.Kind != bth.KindReadRequest {
			return
		}
		mu.Lock()
		reqs = append(reqs, req{p.BTH.PSN(), p.RETH.VA(), p.RETH.DMALength()})
		mu.Unlock()
	})
	src, smr := b.buffer(t, size, memreg.AccessRemoteRead)
	fill(src, 31)
	dst, dmr := a.buffer(t, size, memreg.AccessLocalWrite)
	if err := a.qp.PostSend(SendWR{WRID: 1, Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, 0, size),
		RemoteAddr: smr.IOVA(), RKey: smr.RKey()}); err != nil {
		t.Fatal(err)
	}
	// A loss is found by the response after it; one that ends a flight
	// by the ACK timer: the clock moves a timeout whenever nothing
	// arrived for a while (a hang guard, not a timing assertion).
	wcs := make([]WC, 1)
	last, idle := uint64(0), 0
	for k := 0; ; k++ {
		if a.scq.Poll(wcs) == 1 {
			break
		}
		if k > 200000 {
			t.Fatalf("READ not complete; requests %v", reqs)
		}
		if r := a.dev.Counters().RcvdPkts; r != last {
			last, idle = r, 0
		} else if idle++; idle > 200 {
			clk.Advance(a.qp.timeout)
			idle = 0
		}
		time.Sleep(100 * time.Microsecond)
	}
	if wcs[0].Status != WCSuccess {
		c := a.dev.Counters()
		t.Fatalf("READ: %v (retries %d, local_ack_timeout_err %d); requests %v", wcs[0].Err(), c.CompleterRetryErr, c.LocalAckTimeout, reqs)
	}
	if !bytes.Equal(dst, src) {
		t.Fatal("READ data differs")
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d READ requests, %d responses sent, %d dropped: %v", len(reqs), drop.sent, drop.dropped, reqs)
	if len(reqs) < 3 {
		t.Fatalf("%d READ requests: the losses did not make the requester ask again", len(reqs))
	}
	prev := -1
	for i, r := range reqs {
		k := int(r.psn.Diff(first))
		if k < 0 || k >= npkts || r.va != smr.IOVA()+uint64(k*mtu) || r.n != uint32(size-k*mtu) {
			t.Fatalf("READ request %d: PSN %v (response %d), VA %#x, length %d; want VA %#x, length %d (the remainder from response %d)",
				i, r.psn, k, r.va, r.n, smr.IOVA()+uint64(k*mtu), size-k*mtu, k)
		}
		if i > 0 && k <= prev {
			t.Fatalf("READ request %d asks from response %d, the one before from %d: no progress", i, k, prev)
		}
		prev = k
	}
	if k := int(reqs[1].psn.Diff(first)); k != nth-1 {
		t.Fatalf("the first re-request asks from response %d, want %d (the first missing)", k, nth-1)
	}
}
