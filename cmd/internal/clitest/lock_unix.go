//go:build unix

package clitest

import (
	"os"
	"path/filepath"
	"syscall"
)

// lockLoopback takes the loopback lock (see Main) and returns its release.
func lockLoopback() (release func(), err error) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "rocev2-cmd-loopback.lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}
