package memreg

import (
	"bytes"
	"errors"
	"testing"
)

// TestTarget: Lookup checks once; Write/WriteV/Read stay inside the checked
// range and rights, and fail as stale once the registration is gone.
func TestTarget(t *testing.T) {
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	buf := alignedBuf(256)
	mr := mustMR(t, pd, buf, 0x1000, allRights)
	tg, err := pd.Lookup(mr.RKey(), 0x1010, 64, AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	if tg.Len() != 64 || tg.VA() != 0x1010 {
		t.Fatalf("target %d bytes at %#x", tg.Len(), tg.VA())
	}
	if err := tg.Write(60, []byte("abcd")); err != nil || string(buf[0x4c:0x50]) != "abcd" {
		t.Fatalf("write at end of target: %v", err)
	}
	if err := tg.Write(61, []byte("abcd")); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("write past target: %v", err)
	}
	if err := tg.Read(0, make([]byte, 4)); !errors.Is(err, ErrAccessDenied) {
		t.Fatalf("read through a write target: %v", err)
	}
	if err := tg.WriteV(8, [][]byte{[]byte("xy"), nil, []byte("z")}); err != nil || string(buf[0x18:0x1b]) != "xyz" {
		t.Fatalf("WriteV: %v %q", err, buf[0x18:0x1b])
	}
	before := bytes.Clone(buf)
	if err := tg.WriteV(60, [][]byte{[]byte("12"), []byte("345")}); !errors.Is(err, ErrOutOfBounds) || !bytes.Equal(buf, before) {
		t.Fatalf("WriteV past target: %v (placed anyway: %v)", err, !bytes.Equal(buf, before))
	}
	rt, err := pd.Lookup(mr.RKey(), 0x1000, 16, AccessRemoteRead|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if err := rt.Read(0, got); err != nil || !bytes.Equal(got, buf[:4]) {
		t.Fatalf("read: %v", err)
	}
	if _, err := pd.Lookup(mr.RKey(), 0x10f0, 32, AccessRemoteWrite); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("lookup past region: %v", err)
	}
	if _, err := pd.Lookup(mr.RKey(), 0x1000, 8, AccessLocalWrite); !errors.Is(err, ErrInvalidAccessFlags) {
		t.Fatalf("lookup with a local right: %v", err)
	}
	z, err := pd.Lookup(0xdeadbeef, 0x1234, 0, AccessRemoteWrite)
	if err != nil || z.Write(0, nil) != nil || !errors.Is(z.Write(0, []byte{1}), ErrOutOfBounds) {
		t.Fatalf("zero-length target: %v", err)
	}
	if z.VA() != 0x1234 || z.Len() != 0 {
		t.Fatalf("zero-length target: %d bytes at %#x", z.Len(), z.VA())
	}
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := tg.Write(0, []byte{1}); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("write through target after deregister: %v", err)
	}
	if err := tg.WriteV(0, [][]byte{{1}}); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("WriteV after deregister: %v", err)
	}
	if err := rt.Read(0, got); !errors.Is(err, ErrStaleKey) {
		t.Fatalf("read through target after deregister: %v", err)
	}
}
