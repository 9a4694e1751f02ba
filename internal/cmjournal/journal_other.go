//go:build !linux

package cmjournal

import (
	"errors"
	"net/netip"
)

// Elsewhere than on Linux there is no journal (its liveness is a flock,
// its scope a network namespace cookie): a killed process's peers are not
// told.

// Journal is a connection manager's journal; none exists on this system.
type Journal struct{}

// Root returns "": no journal on this system.
func Root() string { return "" }

// Open fails: no journal on this system.
func Open(string, netip.Addr) (*Journal, error) {
	return nil, errors.New("no connection journal on this system")
}

// Dir returns "".
func (*Journal) Dir() string { return "" }

// Add does nothing.
func (*Journal) Add(Record) error { return nil }

// Remove does nothing.
func (*Journal) Remove(uint32) {}

// Close does nothing.
func (*Journal) Close() {}

// Abandon does nothing.
func (*Journal) Abandon() {}

// Sent does nothing.
func (*Journal) Sent(Record) {}

// TakeDead returns nothing.
func (*Journal) TakeDead() []Record { return nil }

// SweepOtherScopes does nothing.
func (*Journal) SweepOtherScopes() {}

// Owner states, as OwnerState reports them.
const (
	OwnerGone = iota
	OwnerAlive
	OwnerDead
)

// OwnerState reports OwnerGone: no journal on this system.
func OwnerState(string) int { return OwnerGone }

// RootDir returns "".
func (*Journal) RootDir() string { return "" }
