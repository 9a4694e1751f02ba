package rdmacm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cm"
	"github.com/gorocev2/rocev2/transport"
	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestMRAInRepeatedREQsTrafficClass: the MRA that answers a repeated REQ
// (the application has not decided) goes in the traffic class that REQ
// arrived in, not the REQ's primary path traffic class nor the
// listener's, as Linux's cm_dup_req_handler sends it with a response
// MAD addressed from the packet received (cm_alloc_response_msg,
// ib_init_ah_attr_from_wc). Here the REQ asks for 0x20, the listener has
// 0x40, and the repeated REQ comes in 0x48. Before, the MRA went in the
// listener's (or the REQ path's) class.
func TestMRAInRepeatedREQsTrafficClass(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	rec := &tosLink{tos: map[string]map[uint8]int{}}
	db := newDev(t, n, addrB, func(l udp.Link) udp.Link { rec.Link = l; return rec })
	mb, err := managerFor(db)
	if err != nil {
		t.Fatal(err)
	}
	lo := ListenOptions{Options: fast, HalfOpenTimeout: time.Hour}
	lo.TrafficClass = 0x40
	l, err := Listen(db, 7760, &lo)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	peer := netip.MustParseAddr("198.51.100.60")
	req := forgedREQ(7760, peer, addrB, 0x7760, 0x660)
	req.Primary.TrafficClass = 0x20
	inject := func(tos uint8) {
		mad := transport.MAD{Src: peer, SrcQP: 1, TOS: tos}
		h := cm.NewHeader(0, 1)
		if err := cm.Encode(mad.Data[:], &h, req); err != nil {
			t.Fatal(err)
		}
		mb.dispatch(&mad)
	}
	inject(0x20)
	if _, err := l.Next(ctxT(t, 5*time.Second)); err != nil { // taken, not answered
		t.Fatal(err)
	}
	before := rec.seen()["MAD"]
	inject(0x48) // the requester's retry
	after := rec.seen()["MAD"]
	sent := map[uint8]int{}
	for tos, n := range after {
		if d := n - before[tos]; d > 0 {
			sent[tos] = d
		}
	}
	if len(sent) != 1 || sent[0x48] != 1 || StatsOf(db).Duplicates != 1 {
		t.Errorf("MADs sent for the repeated REQ by traffic class: %v (duplicates %d), want one MRA in 0x48", sent, StatsOf(db).Duplicates)
	}
}
