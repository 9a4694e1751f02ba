package main

import (
	"testing"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// runInRetry is runIn, retried while UDP 4791 is taken by someone else.
func runInRetry(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	for try := 0; ; try++ {
		code, out, errOut := runIn(t, args...)
		if try == 4 || !clitest.PortBusy(errOut) {
			return code, out, errOut
		}
		time.Sleep(300 * time.Millisecond)
	}
}
