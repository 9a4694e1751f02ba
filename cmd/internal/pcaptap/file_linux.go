package pcaptap

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// createFile creates path for writing, with O_DIRECT if it is a regular
// file on a file system that takes it (direct reports which). A pipe, a
// terminal or a device (--pcap /dev/stdout) is written as a stream.
func createFile(path string) (f *os.File, direct bool, err error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		// Not even a try: opening a FIFO with O_DIRECT opens it (a
		// reader waiting on it wakes) before the open fails, and the
		// reader sees the writer leave: end of file.
		f, err = os.Create(path)
		return f, false, err
	}
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_DIRECT, 0o644)
	if err == nil {
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, false, err
		}
		if st.Mode().IsRegular() {
			return f, true, nil
		}
		if err := clearDirect(f); err != nil {
			f.Close()
			return nil, false, err
		}
		return f, false, nil
	}
	if !isEINVAL(err) {
		return nil, false, err
	}
	f, err = os.Create(path)
	return f, false, err
}

// clearDirect switches f to buffered writes.
func clearDirect(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(fd, unix.F_SETFL, fl&^unix.O_DIRECT)
		}
		ferr = err
	}); err != nil {
		return err
	}
	return ferr
}

func isEINVAL(err error) bool { return errors.Is(err, unix.EINVAL) }

// mapBuffer returns n bytes of anonymous memory (page-aligned, as direct
// I/O needs) advised to use transparent huge pages: a 2 MiB buffer is then
// one page to fault in and to pin for each write instead of 512. It
// returns nil if the mapping fails.
func mapBuffer(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // advice only
	return b
}

// unmapBuffer releases a buffer of mapBuffer.
func unmapBuffer(b []byte) { _ = unix.Munmap(b) }
