//go:build !unix

package cli

// MapMemory allocates n bytes on the Go heap where mmap is not available.
func MapMemory(n int) (b []byte, free func(), err error) {
	return make([]byte, n), func() {}, nil
}
