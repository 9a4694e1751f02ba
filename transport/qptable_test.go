package transport

import (
	"testing"

	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestQPTablePagesFreed: QPNs go round the whole 24-bit space on an
// unshared device, and the QP table's pages stayed allocated once used:
// a process whose connections come and go grew by 32 KiB every 4096 QPs it
// ever created, to 128 MiB with none alive (longev25 F1). A page is let go
// with its last QP, so creating and destroying QPs over many pages keeps
// the table at the pages that hold live QPs (and the GSI's); a QP that
// lives on keeps its page and is still found, and a destroyed one's
// number finds nothing even after its page was reused for other QPNs.
func TestQPTablePagesFreed(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	la, _ := n.Link(addrA)
	dev, err := NewDevice(la, DeviceConfig{FirstQPN: 0x11})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(64)
	create := func() *QP {
		qp, err := dev.CreateQP(pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil {
			t.Fatal(err)
		}
		return qp
	}
	keep := create()
	base := dev.qpTab.pageCount()
	var gone []uint32
	for i := range 5 * 4096 {
		qp := create()
		if i%4096 == 100 {
			gone = append(gone, qp.QPN())
		}
		qp.Destroy()
		if pages := dev.qpTab.pageCount(); pages > base+1 {
			t.Fatalf("after %d QPs created and destroyed: %d table pages, want at most %d", i+1, pages, base+1)
		}
	}
	if got := dev.lookup(keep.QPN()); got != keep {
		t.Fatalf("live QP %#x not found after the churn", keep.QPN())
	}
	for _, q := range gone {
		if got := dev.lookup(q); got != nil {
			t.Fatalf("destroyed QPN %#x finds QP %#x", q, got.QPN())
		}
	}
	keep.Destroy()
	if pages := dev.qpTab.pageCount(); pages > base {
		t.Fatalf("with only the GSI left: %d pages, want at most %d", pages, base)
	}
}
