//go:build !unix

package main

// mapMemory allocates n bytes on the Go heap where mmap is not available.
func mapMemory(n int) (b []byte, free func(), err error) {
	return make([]byte, n), func() {}, nil
}
