package transport

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/memreg"
	"github.com/gorocev2/rocev2/udp/memnet"
)

// TestAfterClose: after Device.Close the QPs, CQs, SRQs and channels
// answer ErrClosed, so do the PD calls that hand out memory, and the calls
// that give memory back work: the PD can be deallocated, because Close
// released the QPs' and the SRQ's hold on it. The cases run in order.
func TestAfterClose(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrA, &o)
	_, mr := s.buffer(t, 64, memreg.AccessMWBind)
	mw, err := s.pd.AllocMW(memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	pd2, err := s.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := s.dev.CreateSRQ(pd2, SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	cq, err := s.dev.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.dev.CreateQP(pd2, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, SRQ: srq, MaxSendWR: 1}); err != nil {
		t.Fatal(err)
	}
	ch, err := s.dev.CreateCompChannel(1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.dev.CreateCQWith(CQAttr{Depth: 4, Channel: ch}); err != nil {
		t.Fatal(err)
	}
	if err := s.dev.Close(); err != nil {
		t.Fatal(err)
	}
	closed := []error{ErrClosed}
	for _, c := range []struct {
		name string
		call func() error
		want []error // nil: success
	}{
		{"QP.Query", func() error { _, err := s.qp.Query(); return err }, closed},
		{"QP.Modify", func() error { return s.qp.Modify(&QPAttr{State: QPSReset}, AttrState) }, closed},
		{"QP.PostSend", func() error { return s.qp.PostSend(SendWR{Opcode: WRSend, SGEs: sge(mr, 0, 8)}) }, closed},
		{"QP.PostRecv", func() error { return s.qp.PostRecv(RecvWR{SGEs: sge(mr, 0, 8)}) }, closed},
		{"QP.Destroy", s.qp.Destroy, closed},
		{"CQ.Destroy", s.scq.Destroy, closed},
		{"SRQ.Destroy", srq.Destroy, closed},
		{"CompChannel.Destroy", ch.Destroy, closed},
		{"HandlePacket", func() error { return s.dev.HandlePacket(cnpTo(s.qp.QPN()), addrB) }, closed},
		{"PD.RegisterMR", func() error {
			_, err := s.pd.RegisterMR(make([]byte, 8), memreg.AccessLocalWrite)
			return err
		}, []error{ErrClosed, memreg.ErrTableClosed}},
		{"PD.AllocMW", func() error { _, err := s.pd.AllocMW(memreg.MWType1); return err }, []error{ErrClosed, memreg.ErrTableClosed}},
		{"MW.Bind", func() error {
			_, err := mw.Bind(mr, mr.IOVA(), 8, memreg.AccessRemoteRead)
			return err
		}, []error{ErrClosed, memreg.ErrTableClosed}},
		{"PD.Dealloc with a region", s.pd.Dealloc, []error{ErrBusy}},
		{"MW.Dealloc", mw.Dealloc, nil},
		{"MR.Deregister", mr.Deregister, nil},
		{"PD.Dealloc of the QP's PD", s.pd.Dealloc, nil},
		{"PD.Dealloc of the SRQ's PD", pd2.Dealloc, nil},
	} {
		err := c.call()
		if c.want == nil {
			if err != nil {
				t.Errorf("%s after Close: %v, want success", c.name, err)
			}
			continue
		}
		for _, w := range c.want {
			if !errors.Is(err, w) {
				t.Errorf("%s after Close: %v, want %v", c.name, err, w)
			}
		}
	}
	if st := s.qp.State(); st != QPSErr {
		t.Errorf("QP.State after Close: %v, want ERR", st)
	}
	if u := s.dev.table.Usage(); u != (memreg.Usage{}) {
		t.Errorf("table usage after releasing everything: %+v, want zero", u)
	}
}

// TestBusyMessages: PD.Dealloc's ErrBusy is transport.ErrBusy as well,
// and CQ.Destroy counts QPs, not queues.
func TestBusyMessages(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrA, &o) // one QP, scq for send and rcq for receive
	cq, err := s.dev.CreateCQ(4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.dev.CreateQP(s.pd, QPInitAttr{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, MaxSendWR: 1, MaxRecvWR: 1}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		call func() error
		msg  string
	}{
		{"PD used by two QPs", s.pd.Dealloc, "2 queue pairs or SRQs still hold it"},
		{"CQ used by one QP for both queues", cq.Destroy, "1 QPs use the CQ"},
		{"CQ used by one QP for sending", s.scq.Destroy, "1 QPs use the CQ"},
	} {
		err := c.call()
		if !errors.Is(err, ErrBusy) || !errors.Is(err, memreg.ErrBusy) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want ErrBusy (transport and memreg) saying %q", c.name, err, c.msg)
		}
	}
}

// TestWaitEmptyWC: Wait with no room for a completion is refused at once
// instead of returning (0, nil), which made a caller's loop spin.
func TestWaitEmptyWC(t *testing.T) {
	n := memnet.NewMemNetwork(memnet.Faults{})
	o := pairOpts{}
	o.defaults()
	s := newSide(t, n, addrA, &o)
	for _, c := range []struct {
		name string
		wc   []WC
	}{
		{"nil", nil},
		{"empty", []WC{}},
		{"zero-length slice of a buffer", make([]WC, 4)[:0]},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		k, err := s.scq.Wait(ctx, c.wc)
		cancel()
		if k != 0 || !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "wc is empty") {
			t.Errorf("Wait(%s): %d, %v; want ErrInvalidArgument naming wc", c.name, k, err)
		}
	}
}

// TestSGEErrorField: a refused SGE names the field at fault (the key, the
// address or the length), and a key of another device is not called
// merely stale.
func TestSGEErrorField(t *testing.T) {
	a, b, _ := newPair(t, pairOpts{})
	_, mr := a.buffer(t, 64, 0)
	roMR, err := a.pd.RegisterMR(make([]byte, 64), 0) // no local write
	if err != nil {
		t.Fatal(err)
	}
	// A key of B whose index is in use on A with another key byte.
	var bmr *memreg.MR
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatalf("B never handed out A's index %#x with another key byte", memreg.KeyIndex(mr.LKey()))
		}
		_, bmr = b.buffer(t, 64, 0)
		if memreg.KeyIndex(bmr.LKey()) == memreg.KeyIndex(mr.LKey()) && bmr.LKey() != mr.LKey() {
			break
		}
		if err := bmr.Deregister(); err != nil {
			t.Fatal(err)
		}
	}
	srq, err := a.dev.CreateSRQ(a.pd, SRQAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	va, key := mr.IOVA(), mr.LKey()
	send := func(s memreg.SGE) error { return a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: []memreg.SGE{s}}) }
	recv := func(s memreg.SGE) error { return a.qp.PostRecv(RecvWR{SGEs: []memreg.SGE{s}}) }
	srqRecv := func(s memreg.SGE) error { return srq.PostRecv(RecvWR{SGEs: []memreg.SGE{s}}) }
	for _, c := range []struct {
		name  string
		post  func(memreg.SGE) error
		sge   memreg.SGE
		field string
		cause error
		msg   string
	}{
		{"unknown lkey", send, memreg.SGE{Addr: va, Length: 8, LKey: 0x999}, "sg_list[0].lkey", memreg.ErrUnknownKey, ""},
		{"lkey of another device", send, bmr.SGE(0, 8), "sg_list[0].lkey", memreg.ErrStaleKey, "another device"},
		{"addr before the region", send, memreg.SGE{Addr: va - 1, Length: 8, LKey: key}, "sg_list[0].addr", memreg.ErrOutOfBounds, ""},
		{"addr after the region", send, memreg.SGE{Addr: va + 64, Length: 1, LKey: key}, "sg_list[0].addr", memreg.ErrOutOfBounds, ""},
		{"length past the end", send, memreg.SGE{Addr: va + 60, Length: 8, LKey: key}, "sg_list[0].length", memreg.ErrOutOfBounds, ""},
		{"length wraps", send, memreg.SGE{Addr: ^uint64(0) - 2, Length: 8, LKey: key}, "sg_list[0].length", memreg.ErrAddressWrap, ""},
		{"recv without local write", recv, roMR.SGE(0, 8), "sg_list[0].lkey", memreg.ErrAccessDenied, ""},
		{"recv past the end", recv, memreg.SGE{Addr: va + 32, Length: 64, LKey: key}, "sg_list[0].length", memreg.ErrOutOfBounds, ""},
		{"SRQ recv unknown lkey", srqRecv, memreg.SGE{Addr: va, Length: 8, LKey: 0x999}, "sg_list[0].lkey", memreg.ErrUnknownKey, ""},
		{"SRQ recv addr before", srqRecv, memreg.SGE{Addr: va - 8, Length: 8, LKey: key}, "sg_list[0].addr", memreg.ErrOutOfBounds, ""},
	} {
		err := c.post(c.sge)
		var we *WRError
		if !errors.As(err, &we) || we.Field != c.field || !errors.Is(err, c.cause) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v (WRError %+v), want Field %q, cause %v, text %q", c.name, err, we, c.field, c.cause, c.msg)
		}
	}
	// A list is checked whole first: the element named is still the
	// first that fails (a zero-length element checks no key).
	list := []memreg.SGE{{Addr: va, Length: 8, LKey: key}, {Addr: va, Length: 0, LKey: 0x999},
		{Addr: va + 64, Length: 1, LKey: key}, {Addr: va, Length: 8, LKey: 0x999}}
	err = a.qp.PostSend(SendWR{Opcode: WRSend, SGEs: list})
	if we := (*WRError)(nil); !errors.As(err, &we) || we.Field != "sg_list[2].addr" || !errors.Is(err, memreg.ErrOutOfBounds) {
		t.Errorf("list: %v, want sg_list[2].addr out of bounds", err)
	}
}

// TestAPIDocs: doc comments that promised less (or other) than the code
// does.
func TestAPIDocs(t *testing.T) {
	fset := token.NewFileSet()
	docs := map[string]string{}
	for _, f := range []string{"qp.go", "wc.go", "device.go"} {
		af, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				docs[n.Name.Name] = n.Doc.Text()
			case *ast.Field:
				if len(n.Names) == 1 {
					docs[n.Names[0].Name] += n.Doc.Text() + n.Comment.Text()
				}
			}
			return true
		})
	}
	for _, c := range []struct {
		name      string
		want, not []string
	}{
		{"CreateQP", []string{"QPTypeRC", "QPTypeUC", "QPTypeUD"}, []string{"creates an RC QP"}},
		{"Field", []string{"sg_list[1].lkey", ".addr", ".length"}, nil},
		{"Close", []string{"PD.Dealloc", "MR.Deregister", "RegisterMR"}, nil},
	} {
		d := docs[c.name]
		for _, w := range c.want {
			if !strings.Contains(d, w) {
				t.Errorf("doc of %s does not mention %q:\n%s", c.name, w, d)
			}
		}
		for _, w := range c.not {
			if strings.Contains(d, w) {
				t.Errorf("doc of %s still says %q", c.name, w)
			}
		}
	}
}
