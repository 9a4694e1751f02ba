//go:build !linux

package memreg

// populateOS is not available here: populate touches the pages itself.
func populateOS(buf []byte, write bool) int { return populateUnsupported }
