package memreg

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gorocev2/rocev2/aeth"
)

func TestSGEChecks(t *testing.T) {
	f := newFixture(t)
	rw, ro, local, other := f.rw.LKey(), f.ro.LKey(), f.local.LKey(), f.other.LKey()
	const (
		LW  = AccessLocalWrite
		op  = aeth.NAKRemoteOperationalError
		inv = aeth.NAKInvalidRequest
	)
	cases := []struct {
		name  string
		sges  []SGE
		acc   Access
		total uint64
		err   error
		nak   aeth.NAKCode
	}{
		{"empty list", nil, LW, 0, nil, 0},
		{"two regions read", []SGE{{ioRW, 100, rw}, {ioRO + 10, 50, ro}}, 0, 150, nil, 0},
		{"local write region", []SGE{{ioLocal, 4096, local}}, LW, 4096, nil, 0},
		{"zero-length SGE skips key", []SGE{{0, 0, f.unknownKey}, {ioRW, 8, rw}}, LW, 8, nil, 0},
		{"unknown lkey", []SGE{{ioRW, 8, f.unknownKey}}, 0, 0, ErrUnknownKey, op},
		{"stale lkey", []SGE{{ioStale, 8, f.staleKey}}, 0, 0, ErrStaleKey, op},
		{"other PD", []SGE{{ioOther, 8, other}}, 0, 0, ErrWrongPD, op},
		{"window key as lkey", []SGE{{ioRW + 1024, 8, f.w1Key}}, 0, 0, ErrKeyType, op},
		{"write to region without local write", []SGE{{ioRW, 8, rw}, {ioRO, 8, ro}}, LW, 0, ErrAccessDenied, op},
		{"SGE past region", []SGE{{ioRW + 4000, 97, rw}}, 0, 0, ErrOutOfBounds, op},
		{"SGE before region", []SGE{{ioRW - 8, 16, rw}}, 0, 0, ErrOutOfBounds, op},
		{"SGE wraps", []SGE{{^uint64(0) - 1, 8, rw}}, 0, 0, ErrAddressWrap, op},
		{"remote right as local access", []SGE{{ioRW, 8, rw}}, AccessRemoteWrite, 0, ErrInvalidAccessFlags, op},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			total, err := f.pd.CheckSGEs(c.sges, c.acc)
			if !errors.Is(err, c.err) {
				t.Fatalf("want %v, got %v", c.err, err)
			}
			if err != nil {
				if NAKCode(err) != c.nak {
					t.Errorf("NAK %v, want %v", NAKCode(err), c.nak)
				}
				t.Log(err)
				return
			}
			if total != c.total {
				t.Errorf("total %d, want %d", total, c.total)
			}
		})
	}
}

func TestScatterGather(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	a, b, c := alignedBuf(16), alignedBuf(16), alignedBuf(16)
	ma := mustMR(t, pd, a, 0x1000, AccessLocalWrite)
	mb := mustMR(t, pd, b, 0x2000, AccessLocalWrite)
	mc := mustMR(t, pd, c, 0x3000, AccessLocalWrite)
	ro := mustMR(t, pd, alignedBuf(16), 0x4000, 0)
	// 5 bytes of a (from offset 3), an empty SGE, 10 of b, 16 of c = 31 bytes.
	sges := []SGE{{0x1003, 5, ma.LKey()}, {0, 0, 0}, {0x2000, 10, mb.LKey()}, {0x3000, 16, mc.LKey()}}
	src := []byte("0123456789abcdefghijklmnopqrstu")
	if len(src) != 31 {
		t.Fatal(len(src))
	}
	if err := pd.Scatter(sges, 0, src[:7]); err != nil {
		t.Fatal(err)
	}
	if err := pd.Scatter(sges, 7, src[7:]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a[3:8], src[:5]) || !bytes.Equal(b[:10], src[5:15]) || !bytes.Equal(c, src[15:]) {
		t.Fatalf("scatter placed a=%q b=%q c=%q", a, b, c)
	}
	for off := 0; off <= 31; off++ {
		for n := 0; off+n <= 31; n++ {
			got := make([]byte, n)
			if err := pd.Gather(sges, uint64(off), got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, src[off:off+n]) {
				t.Fatalf("gather(%d,%d) = %q", off, n, got)
			}
		}
	}
	// Too long for the list: ErrLength, NAK invalid request (rxe: RESPST_ERR_LENGTH).
	err := pd.Scatter(sges, 20, make([]byte, 12))
	if !errors.Is(err, ErrLength) || NAKCode(err) != aeth.NAKInvalidRequest {
		t.Fatalf("overlong scatter: %v (NAK %v)", err, NAKCode(err))
	}
	t.Log(err)
	if err := pd.Gather(sges, 32, make([]byte, 1)); !errors.Is(err, ErrLength) {
		t.Fatalf("gather past end: %v", err)
	}
	if err := pd.Scatter(sges, 1<<40, nil); err != nil {
		t.Fatalf("empty scatter: %v", err)
	}
	// Scatter needs local write; gather does not.
	rs := []SGE{{0x4000, 16, ro.LKey()}}
	if err := pd.Scatter(rs, 0, []byte{1}); !errors.Is(err, ErrAccessDenied) || NAKCode(err) != aeth.NAKRemoteOperationalError {
		t.Fatalf("scatter into read-only region: %v", err)
	}
	if err := pd.Gather(rs, 0, make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	// A deregistered region in the list fails with ErrStaleKey.
	if err := mb.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Scatter(sges, 0, src); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("scatter into deregistered region: %v", err)
	}
}
