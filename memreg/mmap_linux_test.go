//go:build linux

package memreg

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"unsafe"

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

// TestRegisterPopulates: RegisterMR faults the pages of fresh anonymous
// memory in (all resident after it, per mincore), writable or read-only
// as the access asks, without changing a byte; with AccessOnDemand it
// leaves them alone (none resident), and they fault in on first use.
func TestRegisterPopulates(t *testing.T) {
	pg := unix.Getpagesize()
	resident := func(mem []byte) int {
		vec := make([]byte, len(mem)/pg)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Skipf("mincore: %v", e)
		}
		n := 0
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	fresh := func(pages int) []byte {
		mem, err := unix.Mmap(-1, 0, pages*pg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			t.Skipf("mmap: %v", err)
		}
		t.Cleanup(func() { unix.Munmap(mem) })
		if n := resident(mem); n != 0 {
			t.Skipf("%d pages of a fresh mapping already resident", n)
		}
		return mem
	}
	tb := NewTable(Limits{})
	pd := mustPD(t, tb)
	for _, tc := range []struct {
		name   string
		access Access
		pages  int
		all    bool // every page resident after (else none)
	}{
		{"writable", allRights, 64, true},
		{"local-read", 0, 64, true},
		{"on-demand", allRights | AccessOnDemand, 64, false},
		// From populateMadviseMin on, one madvise.
		{"writable-large", allRights, 2 * populateMadviseMin / 4096, true},
		{"local-read-large", 0, 2 * populateMadviseMin / 4096, true},
		{"on-demand-large", allRights | AccessOnDemand, 2 * populateMadviseMin / 4096, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pages := tc.pages
			mem := fresh(pages)
			// Register all but the first and last 100 bytes: the range
			// is widened to whole pages.
			mr, err := pd.RegisterMR(mem[100:len(mem)-100], tc.access)
			if err != nil {
				t.Fatal(err)
			}
			defer mr.Deregister()
			got := resident(mem)
			if tc.all && got < pages {
				var u unix.Utsname
				unix.Uname(&u)
				t.Fatalf("%d of %d pages resident after RegisterMR(%v) (kernel %s: MADV_POPULATE_* needs 5.14)", got, pages, tc.access, unix.ByteSliceToString(u.Release[:]))
			}
			if !tc.all && got != 0 {
				t.Fatalf("%d pages resident after RegisterMR(%v)", got, tc.access)
			}
			for i, b := range mem {
				if b != 0 {
					t.Fatalf("byte %d is %#x after RegisterMR: populating changed memory", i, b)
				}
			}
			if tc.access&AccessOnDemand != 0 && !strings.Contains(mr.Access().String(), "ON_DEMAND") {
				t.Errorf("access %v", mr.Access())
			}
		})
	}
}

// TestRegisterReadOnlyMemory: a read-only mapping registered with a write
// right fails with ErrBadAddress (ibv_reg_mr's EFAULT) — on the page-touch
// path (a fault recovered, not a crash) and on the madvise path alike —
// and nothing stays registered; registered read-only, or on demand, it
// works.
func TestRegisterReadOnlyMemory(t *testing.T) {
	pg := unix.Getpagesize()
	for _, pages := range []int{4, 2 * populateMadviseMin / 4096} {
		mem, err := unix.Mmap(-1, 0, pages*pg, unix.PROT_READ, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			t.Skipf("mmap: %v", err)
		}
		t.Cleanup(func() { unix.Munmap(mem) })
		tb := NewTable(Limits{})
		pd := mustPD(t, tb)
		mr, err := pd.RegisterMR(mem, AccessLocalWrite|AccessRemoteWrite)
		if raceBuild && err == nil {
			// Under the race detector populate touches no page itself
			// (a fault inside its runtime cannot be recovered), and
			// the kernel refuses MADV_POPULATE_WRITE on a read-only
			// mapping with EINVAL, which also means "not supported".
			t.Logf("-race: %d pages read-only registered writable: accepted (not populated)", pages)
			mr.Deregister()
			continue
		}
		if !errors.Is(err, ErrBadAddress) {
			t.Fatalf("%d pages read-only, registered writable: %v, want ErrBadAddress", pages, err)
		}
		if !strings.Contains(err.Error(), "cannot be written") {
			t.Errorf("error %q does not say what is wrong", err)
		}
		if u := tb.Usage(); u.MRs != 0 {
			t.Fatalf("a failed registration left %d MRs", u.MRs)
		}
		for _, acc := range []Access{AccessRemoteRead, AccessLocalWrite | AccessRemoteWrite | AccessOnDemand} {
			mr, err := pd.RegisterMR(mem, acc)
			if err != nil {
				t.Fatalf("%d pages read-only, registered %v: %v", pages, acc, err)
			}
			mr.Deregister()
		}
	}
}
