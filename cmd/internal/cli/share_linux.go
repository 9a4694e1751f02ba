//go:build linux

package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// printShareCounters prints the sharing counters of a shared socket link:
// the packets steered to this process, the ones it received that were not
// its (0 unless something is wrong) and the group's drops.
func printShareCounters(w io.Writer, l udp.Link) {
	sl, ok := l.(*udp.SocketLink)
	if !ok || !sl.Shared() {
		return
	}
	s := sl.ShareStats()
	for _, kv := range []struct {
		n string
		v uint64
	}{{"share_slot", uint64(s.Slot)}, {"share_steered_pkts", s.Steered}, {"share_misrouted_pkts", s.Misrouted},
		{"share_drop_unowned_qpn", s.Group.UnownedQPN}, {"share_drop_owner_gone", s.Group.DeadOwner},
		{"share_drop_no_listener", s.Group.NoListener}, {"share_drop_unowned_comm", s.Group.UnownedComm}} {
		fmt.Fprintf(w, "  %-26s %d\n", kv.n, kv.v)
	}
}

// foreignGroup reports whether err is share.ErrAddrInUse: the address's
// sockets are a group this process cannot see, which the error explains.
func foreignGroup(err error) bool { return errors.Is(err, share.ErrAddrInUse) }
