//go:build !linux

package pcaptap

import (
	"errors"
	"os"
)

// createFile creates path for writing (no direct I/O here).
func createFile(path string) (*os.File, bool, error) {
	f, err := os.Create(path)
	return f, false, err
}

// clearDirect is never needed here.
func clearDirect(*os.File) error { return errors.ErrUnsupported }

func isEINVAL(error) bool { return false }

// mapBuffer maps no memory here: buffers come from the Go heap.
func mapBuffer(int) []byte { return nil }

func unmapBuffer([]byte) {}
