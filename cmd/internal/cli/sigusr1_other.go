//go:build !unix

package cli

import "os"

// usr1Signals is empty where SIGUSR1 does not exist: counters print at the
// end of a run only.
var usr1Signals []os.Signal
