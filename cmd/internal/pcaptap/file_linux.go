package pcaptap

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// createFile creates path for writing, with O_DIRECT if its file system
// takes it (direct reports which).
func createFile(path string) (f *os.File, direct bool, err error) {
	f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_DIRECT, 0o644)
	if err == nil {
		return f, true, nil
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
