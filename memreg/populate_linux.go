//go:build linux

package memreg

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

var pageSizeOS = uintptr(unix.Getpagesize())

// populateOS faults buf's pages in with one madvise: MADV_POPULATE_WRITE
// where the region will be written (page tables writable, as a write fault
// leaves them; content unchanged), MADV_POPULATE_READ otherwise. EFAULT or
// ENOMEM (a read-only mapping registered writable, an unmapped page) is
// populateFault; EINVAL (a kernel older than 5.14) populateUnsupported.
// The range is widened to whole pages; the bytes around buf on those pages
// do not change either.
func populateOS(buf []byte, write bool) int {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	end := start + uintptr(len(buf))
	start &^= pageSizeOS - 1
	end = (end + pageSizeOS - 1) &^ (pageSizeOS - 1)
	advice := uintptr(unix.MADV_POPULATE_READ)
	if write {
		advice = unix.MADV_POPULATE_WRITE
	}
	_, _, e := unix.Syscall(unix.SYS_MADVISE, start, end-start, advice)
	switch e {
	case 0:
		return populateDone
	case unix.EFAULT, unix.ENOMEM:
		return populateFault
	}
	return populateUnsupported
}
