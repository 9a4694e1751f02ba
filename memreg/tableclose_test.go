package memreg

import (
	"errors"
	"strings"
	"testing"
)

// TestTableClose: once its owner closes a table, the calls that hand out
// or grant something fail with ErrTableClosed and the owner's cause; the
// calls that give something back keep working, in any order. The cases
// run in order.
func TestTableClose(t *testing.T) {
	cause := errors.New("owner closed")
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	mr := mustMR(t, pd, make([]byte, 64), 0x1000, AccessLocalWrite|AccessMWBind|AccessRemoteRead)
	mw1, err := pd.AllocMW(MWType1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mw1.Bind(mr, 0x1000, 8, AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	mw2, err := pd.AllocMW(MWType2)
	if err != nil {
		t.Fatal(err)
	}
	if err := pd.Acquire(); err != nil {
		t.Fatal(err)
	}
	tb.Close(cause)
	tb.Close(errors.New("second close")) // keeps the first cause
	refused := []error{ErrTableClosed, cause}
	for _, c := range []struct {
		name string
		call func() error
		want []error // nil: success
	}{
		{"AllocPD", func() error { _, err := tb.AllocPD(); return err }, refused},
		{"RegisterMR", func() error { _, err := pd.RegisterMR(make([]byte, 8), AccessLocalWrite); return err }, refused},
		{"AllocMW", func() error { _, err := pd.AllocMW(MWType1); return err }, refused},
		{"Acquire", pd.Acquire, refused},
		{"Bind", func() error { _, err := mw1.Bind(mr, 0x1000, 16, AccessRemoteRead); return err }, refused},
		{"BindQP", func() error { _, err := mw2.BindQP(5, mr, 0x1000, 16, AccessRemoteRead, 1); return err }, refused},
		{"lookup of a live region", func() error { return pd.ReadRemote(mr.RKey(), 0x1000, make([]byte, 8)) }, nil},
		{"Deregister with a window bound", mr.Deregister, []error{ErrBusy}},
		{"unbinding Bind", func() error { _, err := mw1.Bind(nil, 0, 0, 0); return err }, nil},
		{"MW.Dealloc", mw1.Dealloc, nil},
		{"MW.Invalidate of an unbound type 2", mw2.Invalidate, []error{ErrNotBound}},
		{"MW.Dealloc type 2", mw2.Dealloc, nil},
		{"Deregister", mr.Deregister, nil},
		{"Dealloc of a held PD", pd.Dealloc, []error{ErrBusy}},
		{"Release", func() error { pd.Release(); return nil }, nil},
		{"Dealloc", pd.Dealloc, nil},
	} {
		err := c.call()
		if c.want == nil {
			if err != nil {
				t.Errorf("%s on a closed table: %v, want success", c.name, err)
			}
			continue
		}
		for _, w := range c.want {
			if !errors.Is(err, w) {
				t.Errorf("%s on a closed table: %v, want %v", c.name, err, w)
			}
		}
	}
	if u := tb.Usage(); u != (Usage{}) {
		t.Errorf("usage after releasing everything: %+v", u)
	}
}

// TestForeignKeyText: a key of another table whose index is in use here
// fails as ErrStaleKey, and the text does not claim it is merely stale.
func TestForeignKeyText(t *testing.T) {
	ta, tb := NewTable(Limits{}), NewTable(Limits{})
	pa, pb := mustPD(t, ta), mustPD(t, tb)
	ma := mustMR(t, pa, make([]byte, 64), 0x1000, AccessLocalWrite)
	mb := mustMR(t, pb, make([]byte, 64), 0x1000, AccessLocalWrite)
	if mb.LKey() == ma.LKey() { // the same random key byte: take the next one
		if err := mb.Deregister(); err != nil {
			t.Fatal(err)
		}
		mb = mustMR(t, pb, make([]byte, 64), 0x1000, AccessLocalWrite)
	}
	if KeyIndex(mb.LKey()) != KeyIndex(ma.LKey()) {
		t.Fatalf("keys %#x and %#x: different indices", ma.LKey(), mb.LKey())
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"CheckSGEs", func() error { _, err := pa.CheckSGEs([]SGE{mb.SGE(0, 8)}, 0); return err }()},
		{"Gather", pa.Gather([]SGE{mb.SGE(0, 8)}, 0, make([]byte, 8))},
	} {
		if !errors.Is(c.err, ErrStaleKey) || !strings.Contains(c.err.Error(), "another device") {
			t.Errorf("%s with another table's key: %v, want ErrStaleKey mentioning another device", c.name, c.err)
		}
	}
}
