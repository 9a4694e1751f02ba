//go:build unix

package cli

import (
	"os"
	"syscall"
)

// HangupSignals are the signals that make a server read its
// configuration again (SIGHUP).
var HangupSignals = []os.Signal{syscall.SIGHUP}
