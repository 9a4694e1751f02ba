package memreg

import (
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"unsafe"
)

// touchPage is the page size populate steps by: 4 KiB, the smallest page
// of the platforms this runs on (a larger page is touched more than once,
// harmlessly).
const touchPage = 4096

// populateMadviseMin is the region size from which populate asks the
// kernel to fault the whole range in with one call (populateOS, Linux),
// instead of touching each page: on resident memory the call costs more
// than touching 16 pages (~3 µs for 64 KiB here, where a touch is a few
// nanoseconds), on fresh memory it saves a trap per page.
const populateMadviseMin = 1 << 20

// populateSink keeps the loads of a read-only populate.
var populateSink atomic.Uint32

// populate faults buf's pages in before the region is used, as
// ibv_reg_mr's pinning does (see AccessOnDemand): for a region that will
// be written, an atomic add of zero to a 4-byte word on each page (a write
// fault on a page not yet written, changing no byte, and losing no
// concurrent store); otherwise a load from each page. Large regions go to
// the kernel in one call where it can (populateOS). Only words entirely
// inside buf are touched. Memory that cannot be accessed so (a read-only
// mapping registered writable, an unmapped page) gives ErrBadAddress, as
// ibv_reg_mr fails with EFAULT, instead of a crash on the data path.
func populate(buf []byte, write bool) (err error) {
	if len(buf) >= populateMadviseMin || raceBuild {
		switch populateOS(buf, write) {
		case populateDone:
			return nil
		case populateFault:
			return badAddress(write)
		}
		if raceBuild {
			// Touching could fault inside the race detector's
			// runtime, which no recover catches: the pages fault
			// in on first use instead.
			return nil
		}
	}
	// A fault while touching panics here (and is recovered) rather than
	// killing the process.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = badAddress(write)
		}
	}()
	base := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	end := base + uintptr(len(buf))
	// The first 4-byte aligned word in buf, then one word per page.
	w := (base + 3) &^ 3
	var sum uint32
	for w+4 <= end {
		p := (*uint32)(unsafe.Pointer(unsafe.SliceData(buf[w-base:])))
		if write {
			atomic.AddUint32(p, 0)
		} else {
			sum += atomic.LoadUint32(p)
		}
		w = (w + touchPage) &^ (touchPage - 1)
	}
	if !write {
		populateSink.Add(sum)
	}
	return nil
}

// badAddress is populate's error.
func badAddress(write bool) error {
	if write {
		return fmt.Errorf("%w: a page of the buffer cannot be written (a write right needs writable memory)", ErrBadAddress)
	}
	return fmt.Errorf("%w: a page of the buffer cannot be read", ErrBadAddress)
}

// populateOS's results: the kernel faulted the range in; it found a page
// it could not (EFAULT, ENOMEM); it cannot do it at all here (no such
// call, a kernel older than 5.14), and populate touches the pages itself.
const (
	populateDone = iota
	populateFault
	populateUnsupported
)
