package transport

import (
	"sync"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/bth"
	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/packet"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// readSendLink counts, per Link.Send, the READ request and READ response
// packets it carries. With gather set, a Recv that returns READ requests
// keeps receiving (blocking) until gather of them are in the batch, so
// that the device gets them in one received batch whatever the timing.
type readSendLink struct {
	udp.Wrap
	mu     sync.Mutex
	reqs   []int // READ requests per Send that held any
	resps  []int // READ responses per Send that held any
	gather int
}

func (l *readSendLink) Send(pkts []udp.Packet) error {
	var p packet.Packet
	req, resp := 0, 0
	for _, up := range pkts {
		if p.Decode(up.Buf) != packet.FaultNone {
			continue
		}
		switch p.Info.Kind {
		case bth.KindReadRequest:
			req++
		case bth.KindReadResponse:
			resp++
		}
	}
	l.mu.Lock()
	if req > 0 {
		l.reqs = append(l.reqs, req)
	}
	if resp > 0 {
		l.resps = append(l.resps, resp)
	}
	l.mu.Unlock()
	return l.Link.Send(pkts)
}

func (l *readSendLink) Recv(pkts []udp.Packet) (int, error) {
	n, err := l.Link.Recv(pkts)
	if err != nil || n == 0 || l.gather == 0 {
		return n, err
	}
	count := func(ps []udp.Packet) int {
		var p packet.Packet
		k := 0
		for _, up := range ps {
			if p.Decode(up.Buf) == packet.FaultNone && p.Info.Kind == bth.KindReadRequest {
				k++
			}
		}
		return k
	}
	got := count(pkts[:n])
	for got > 0 && got < l.gather && n < len(pkts) {
		k, err := l.Link.Recv(pkts[n:])
		if err != nil {
			return n, nil // the next Recv reports it
		}
		got += count(pkts[n : n+k])
		n += k
	}
	return n, nil
}

func (l *readSendLink) counts() (reqs, resps []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.reqs...), append([]int(nil), l.resps...)
}

// TestReadsPostedTogetherLeaveTogether: READs posted in one PostSend
// leave in one Link.Send (on a socket link: one system call, the equal
// requests one GSO datagram), and a responder that receives them in one
// batch answers all of them in one Link.Send (flushPending), in PSN
// order: the batching `rocev2d bench`'s READ row relies on (see
// docs/PERFORMANCE.md, session 31). A request flushed as it is built
// would make the first count 8 Sends of one; responses flushed per
// request, 8 Sends of 4.
func TestReadsPostedTogetherLeaveTogether(t *testing.T) {
	const reads, size = 8, 4096 // 4 responses each at MTU 1024
	o := pairOpts{}
	o.defaults()
	la, lb := memLinks(t, memnet.Faults{})
	ta := &readSendLink{Wrap: udp.Wrap{Link: la}}
	tb := &readSendLink{Wrap: udp.Wrap{Link: lb}, gather: reads}
	a, b := newSideOn(t, ta, &o), newSideOn(t, tb, &o)
	connect(t, a, b, addrB, 0x10, 0x20, &o)
	connect(t, b, a, addrA, 0x20, 0x10, &o)
	src, smr := b.buffer(t, reads*size, memreg.AccessRemoteRead)
	for i := range src {
		src[i] = byte(i*7 + i>>8)
	}
	dst, dmr := a.buffer(t, reads*size, 0)
	wrs := make([]SendWR, reads)
	for i := range wrs {
		wrs[i] = SendWR{WRID: uint64(i), Opcode: WRRead, Flags: SendSignaled, SGEs: sge(dmr, i*size, size),
			RemoteAddr: smr.IOVA() + uint64(i*size), RKey: smr.RKey()}
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	for i, wc := range waitWC(t, a.scq, reads, 20*time.Second) {
		if wc.Status != WCSuccess || wc.WRID != uint64(i) {
			t.Fatalf("completion %d: WRID %d status %v", i, wc.WRID, wc.Status)
		}
	}
	for i := range dst {
		if dst[i] != src[i] {
			t.Fatalf("byte %d read as %#x, want %#x", i, dst[i], src[i])
		}
	}
	reqs, _ := ta.counts()
	_, resps := tb.counts()
	if len(reqs) != 1 || reqs[0] != reads {
		t.Errorf("READ requests per Send of the requester: %v, want [%d] (one Send for the READs of one PostSend)", reqs, reads)
	}
	if len(resps) != 1 || resps[0] != reads*size/1024 {
		t.Errorf("READ responses per Send of the responder: %v, want [%d] (one Send for a received batch's READs)", resps, reads*size/1024)
	}
}
