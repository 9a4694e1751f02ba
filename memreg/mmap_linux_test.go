//go:build linux

package memreg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMmapMemory: page-aligned memory from mmap registers and works like a
// Go slice, and can be unmapped once Deregister has returned.
func TestMmapMemory(t *testing.T) {
	pg := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 2*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	mr, err := pd.RegisterMR(mem, allRights)
	if err != nil {
		t.Fatal(err)
	}
	if mr.IOVA()%uint64(pg) != 0 {
		t.Fatalf("mmap IOVA %#x not page aligned", mr.IOVA())
	}
	payload := bytes.Repeat([]byte{0xab}, 4096)
	if err := pd.WriteRemote(mr.RKey(), mr.IOVA()+uint64(pg)-100, payload[:200]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[pg-100:pg+100], payload[:200]) {
		t.Fatal("write across the page boundary did not land")
	}
	if _, err := pd.FetchAdd(mr.RKey(), mr.IOVA()+8, 5); err != nil {
		t.Fatal(err)
	}
	if v := binary.NativeEndian.Uint64(mem[8:]); v != 5 {
		t.Fatalf("atomic in mmap memory: %d", v)
	}
	if err := pd.Scatter([]SGE{{mr.IOVA() + 16, 4, mr.LKey()}}, 0, []byte("abcd")); err != nil || string(mem[16:20]) != "abcd" {
		t.Fatalf("scatter into mmap memory: %v", err)
	}
	key := mr.RKey()
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	// The memory is gone; the stale key must not touch it.
	if err := pd.WriteRemote(key, 0, payload[:8]); !errors.Is(err, ErrStaleKey) && !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("write through the key of unmapped memory: %v", err)
	}
}
