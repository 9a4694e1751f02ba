package sharecmd

import (
	"testing"

	"github.com/gorocev2/rocev2/cmd/internal/clitest"
)

// runIn runs `rocev2d args` in process and returns status and output.
// (The tests take no loopback lock: they open no socket on 127.0.0.1 or
// 127.0.0.2 of this network namespace.)
func runIn(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return clitest.RunIn(t, Commands(), args...)
}
