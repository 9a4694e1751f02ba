package memreg

import (
	"bytes"
	"fmt"
	"regexp"
	"testing"
)

// keyRE matches the key in an error's text: each run registers anew, under
// other keys.
var keyRE = regexp.MustCompile(`key 0x[0-9a-f]+`)

// TestScatterRefMatchesScatter: ScatterRef does what InitRef and one
// Scatter at offset 0 do, case by case — the same bytes written (or none)
// and the same error — for a live Ref, a Ref of another region, a
// read-only region, a deregistered one, a payload longer than the
// element, an element past its region, another PD, no Pins, no Ref, and
// nothing to place. A fast path that skipped one of Scatter's checks
// would write where Scatter refuses to.
func TestScatterRefMatchesScatter(t *testing.T) {
	type setup struct {
		pd, pd2 *PD
		a, b    []byte // a: local write at 0x1000; b: read only at 0x1000
		ma, mb  *MR
		ra, rb  *Ref
	}
	mk := func(t *testing.T) *setup {
		tb := NewTable(Limits{})
		s := &setup{pd: mustPD(t, tb), pd2: mustPD(t, tb), a: alignedBuf(64), b: alignedBuf(64)}
		s.ma = mustMR(t, s.pd, s.a, 0x1000, AccessLocalWrite)
		s.mb = mustMR(t, s.pd, s.b, 0x1000, 0)
		var err error
		if _, s.ra, err = s.pd.CheckSGEsRef([]SGE{{Addr: 0x1010, Length: 16, LKey: s.ma.LKey()}}, AccessLocalWrite); err != nil || s.ra == nil {
			t.Fatal(s.ra, err)
		}
		if _, s.rb, err = s.pd.CheckSGEsRef([]SGE{{Addr: 0x1010, Length: 16, LKey: s.mb.LKey()}}, 0); err != nil || s.rb == nil {
			t.Fatal(s.rb, err)
		}
		return s
	}
	type tc struct {
		name  string
		sges  func(s *setup) []SGE
		ref   func(s *setup) *Ref
		n     int
		noPin bool
		other bool // through pd2
		dereg bool // a deregistered first
	}
	sgeA := func(addr uint64, l uint32) func(s *setup) []SGE {
		return func(s *setup) []SGE { return []SGE{{Addr: addr, Length: l, LKey: s.ma.LKey()}} }
	}
	sgeB := func(s *setup) []SGE { return []SGE{{Addr: 0x1010, Length: 16, LKey: s.mb.LKey()}} }
	refA := func(s *setup) *Ref { return s.ra }
	refB := func(s *setup) *Ref { return s.rb }
	noRef := func(s *setup) *Ref { return nil }
	for _, c := range []tc{
		{name: "live", sges: sgeA(0x1010, 16), ref: refA, n: 8},
		{name: "whole element", sges: sgeA(0x1010, 16), ref: refA, n: 16},
		{name: "longer than the element", sges: sgeA(0x1010, 16), ref: refA, n: 17},
		{name: "element past the region", sges: sgeA(0x1000+60, 8), ref: refA, n: 8},
		{name: "another region's Ref", sges: sgeA(0x1020, 8), ref: refB, n: 8},
		{name: "read-only region through its Ref", sges: sgeB, ref: refB, n: 8},
		{name: "read-only region through another Ref", sges: sgeB, ref: refA, n: 8},
		{name: "deregistered", sges: sgeA(0x1010, 16), ref: refA, n: 8, dereg: true},
		{name: "another PD", sges: sgeA(0x1010, 16), ref: refA, n: 8, other: true},
		{name: "no Pins", sges: sgeA(0x1010, 16), ref: refA, n: 8, noPin: true},
		{name: "no Ref", sges: sgeA(0x1010, 16), ref: noRef, n: 8},
		{name: "nothing to place", sges: sgeA(0x1010, 16), ref: refA, n: 0},
		{name: "two elements", sges: func(s *setup) []SGE {
			return []SGE{{Addr: 0x1010, Length: 4, LKey: s.ma.LKey()}, {Addr: 0x1030, Length: 8, LKey: s.ma.LKey()}}
		}, ref: refA, n: 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := make([]byte, c.n)
			for i := range src {
				src[i] = 0xc0 | byte(i)
			}
			run := func(fast bool) (string, []byte, []byte) {
				s := mk(t)
				if c.dereg {
					if err := s.ma.Deregister(); err != nil {
						t.Fatal(err)
					}
				}
				pd := s.pd
				if c.other {
					pd = s.pd2
				}
				var ps Pins
				pps := &ps
				if c.noPin {
					pps = nil
				}
				var err error
				if fast {
					err = pd.ScatterRef(pps, c.sges(s), c.ref(s), src)
				} else {
					var sl ScatterList
					sl.InitRef(pd, c.sges(s), c.ref(s))
					err = sl.Scatter(pps, 0, src)
				}
				ps.Release()
				return keyRE.ReplaceAllString(fmt.Sprint(err), "key K"), bytes.Clone(s.a), bytes.Clone(s.b)
			}
			we, wa, wb := run(false)
			ge, ga, gb := run(true)
			if ge != we || !bytes.Equal(ga, wa) || !bytes.Equal(gb, wb) {
				t.Fatalf("ScatterRef: %s\na % x\nb % x\nInitRef and Scatter: %s\na % x\nb % x", ge, ga, gb, we, wa, wb)
			}
		})
	}
}
