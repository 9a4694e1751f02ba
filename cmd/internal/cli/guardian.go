package cli

import (
	"os"

	"github.com/gorocev2/rocev2/rdmacm/guardian"
)

// GuardianEnv turns the guardian off for a rocev2d process when set to
// "off".
const GuardianEnv = "ROCEV2D_GUARDIAN"

// EnableGuardian turns on rdmacm's guardian (package rdmacm/guardian) for
// the process, unless GuardianEnv is "off": each connection manager that
// keeps a connection journal then starts a small child process that sends
// the DREQs of its established connections if this process is killed or
// crashes. rocev2d's main calls it (not init: the commands' in-process
// tests start no guardian).
func EnableGuardian() {
	if os.Getenv(GuardianEnv) != "off" {
		guardian.Enable(true)
	}
}
