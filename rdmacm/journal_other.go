//go:build !linux

package rdmacm

import (
	"errors"
	"net/netip"
)

// The connection journal needs Linux (flock liveness, namespace
// cookies); elsewhere a killed process's peers are not told.

type journal struct{}

type journalRec struct {
	LocalID, RemoteID uint32
	RemoteQPN         uint32
	TOS               uint8
	Peer              netip.Addr
}

func journalRoot() string { return "" }

func openJournal(string, netip.Addr) (*journal, error) {
	return nil, errors.New("rdmacm: no connection journal on this system")
}

func (*journal) path() string           { return "" }
func (*journal) add(journalRec) error   { return nil }
func (*journal) remove(uint32)          {}
func (*journal) close()                 {}
func (*journal) takeDead() []journalRec { return nil }
func (*journal) sweepOtherScopes()      {}
