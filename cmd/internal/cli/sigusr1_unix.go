//go:build unix

package cli

import (
	"os"
	"syscall"
)

// usr1Signals are the signals that print the counters.
var usr1Signals = []os.Signal{syscall.SIGUSR1}
