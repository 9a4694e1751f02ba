//go:build amd64 && !purego && unix

package icrc

import (
	"hash/crc32"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFoldKernelBounds runs foldAVX512 over data that starts right after
// and ends right before an inaccessible page: a read outside p faults.
func TestFoldKernelBounds(t *testing.T) {
	if !hasFold {
		t.Skip("no AVX-512 VPCLMULQDQ on this CPU: foldAVX512 cannot run")
	}
	ps := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 4*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer unix.Munmap(mem)
	// Pages: guard | data | data | guard.
	if err := unix.Mprotect(mem[:ps], unix.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	if err := unix.Mprotect(mem[3*ps:], unix.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	data := mem[ps : 3*ps]
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, n := range []int{256, 272, 320, 336, 512, 528, 1024, 2 * ps} {
		for _, p := range [][]byte{data[:n], data[len(data)-n:]} {
			var x [16]byte
			foldAVX512(^uint32(0), p, &x)
			if got, want := softUpdate(^uint32(0), x[:]), crc32.ChecksumIEEE(p); got != want {
				t.Fatalf("len %d: kernel gives CRC %#08x, crc32 %#08x", n, got, want)
			}
		}
	}
}
