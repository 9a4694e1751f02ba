//go:build !linux

package rdmacm

import "errors"

// GuardianEnv is the environment variable that selects a guardian
// process; no guardian runs on this system.
const GuardianEnv = "ROCEV2_CM_GUARDIAN"

// SetGuardian does nothing on this system: a guardian needs the Linux
// connection journal.
func SetGuardian(on bool) {}

type guardian struct{}

func (m *Manager) startGuardian() {}
func (m *Manager) stopGuardian()  {}

// Guardian returns 0 and an error: no guardian on this system.
func (m *Manager) Guardian() (int, error) {
	return 0, errors.New("rdmacm: no guardian on this system")
}
