//go:build !unix

package cli

import "os"

// HangupSignals is empty where SIGHUP does not exist.
var HangupSignals []os.Signal
