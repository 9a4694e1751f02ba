//go:build !linux

package guardian

import (
	"errors"

	"github.com/gorocev2/rocev2/rdmacm"
)

// Env is the environment variable that makes a process a guardian; none
// runs on this system.
const Env = "ROCEV2_CM_GUARDIAN"

// Enable does nothing on this system: a guardian needs the Linux
// connection journal.
func Enable(on bool) {}

// PID returns 0 and an error: no guardian on this system.
func PID(m *rdmacm.Manager) (int, error) {
	return 0, errors.New("guardian: none on this system")
}
