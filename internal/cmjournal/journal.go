// Package cmjournal is the connection journal of package rdmacm: what a
// killed process leaves so that the next connection manager on its
// address sends the DREQs it could not, as Linux's kernel sends them for
// a killed process's cm_ids.
//
// Layout, under the root (Root):
//
//	<root>/<scope>/<owner>/lock        held (flock) by the owning manager
//	<root>/<scope>/<owner>/<id>.cm     one record per established connection
//
// The scope names the network namespace (its cookie, never reused) and
// the address: only a manager of the same address in the same namespace
// can speak for a dead one. The owner is one manager (a random name): it
// holds an exclusive flock on its lock file for its life, which the
// kernel drops when the process dies however it dies — liveness needs no
// PIDs, so PID namespaces do not fool it. A manager that can take a
// lock owns the dead owner's records: it sends their DREQs and removes
// them.
//
// Every directory is the effective user's and closed to others (0700,
// checked without following symlinks); files open with O_NOFOLLOW, records
// are read only when they are regular files of at most 128
// bytes and their name agrees with their content.
package cmjournal

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Env is the environment variable that places the journal: a directory,
// or "off" for none (Root).
const Env = "ROCEV2_CM_JOURNAL"

// Record is one established connection's record: what its DREQ needs.
type Record struct {
	// LocalID and RemoteID are the connection's communication IDs
	// (the DREQ's LocalCommID and RemoteCommID).
	LocalID, RemoteID uint32
	// RemoteQPN is the peer's QP number.
	RemoteQPN uint32
	// TOS is the traffic class the connection's MADs went with.
	TOS uint8
	// Peer is the peer's address.
	Peer netip.Addr

	file string // where TakeDead moved it (Sent removes it)
}

func (r Record) name() string { return fmt.Sprintf("%08x.cm", r.LocalID) }

func (r Record) encode() []byte {
	return fmt.Appendf(nil, "rocev2-cm 1 %08x %08x %06x %d %s\n", r.LocalID, r.RemoteID, r.RemoteQPN, r.TOS, r.Peer)
}

func parseRecord(b []byte) (Record, error) {
	var r Record
	f := strings.Fields(string(b))
	if len(f) != 7 || f[0] != "rocev2-cm" || f[1] != "1" {
		return r, errors.New("not a version 1 record")
	}
	var v [4]uint64
	var err error
	for i, s := range f[2:6] {
		bits := 32
		switch i {
		case 2:
			bits = 24
		case 3:
			bits = 8
		}
		base := 16
		if i == 3 {
			base = 10
		}
		if v[i], err = strconv.ParseUint(s, base, bits); err != nil {
			return r, err
		}
	}
	if r.Peer, err = netip.ParseAddr(f[6]); err != nil {
		return r, err
	}
	r.LocalID, r.RemoteID, r.RemoteQPN, r.TOS = uint32(v[0]), uint32(v[1]), uint32(v[2]), uint8(v[3])
	return r, nil
}
