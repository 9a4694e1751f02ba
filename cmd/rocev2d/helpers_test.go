//go:build unix

package main

import (
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// runInRetry is runIn, retried while UDP 4791 is taken by someone else.
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RetryBusy(func() (int, string, string) { return runIn(t, args...) })
}

// lockedBuffer is clitest.LockedBuffer.
type lockedBuffer = clitest.LockedBuffer
