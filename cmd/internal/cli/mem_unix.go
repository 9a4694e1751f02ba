//go:build unix

package cli

import "golang.org/x/sys/unix"

// MapMemory maps n bytes of anonymous memory outside the Go heap; free
// unmaps it.
func MapMemory(n int) (b []byte, free func(), err error) {
	b, err = unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { unix.Munmap(b) }, nil
}
