//go:build linux

package sharecmd

import (
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/udp"
	"github.com/gorocev2/rocev2/udp/share"
)

// shareStatus prints the group on addr:4791.
func shareStatus(addr netip.Addr, stdout io.Writer) error {
	st, err := share.ReadStatus(netip.AddrPortFrom(addr, udp.Port), "")
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "group %v: %d member(s)\n", st.Addr, len(st.Members))
	for _, m := range st.Members {
		fmt.Fprintf(stdout, "  slot %d  pid %d  %s", m.Slot, m.PID, m.State)
		if m.State == "timewait" {
			if d := time.Until(m.FreeAt); d > 0 {
				fmt.Fprintf(stdout, " (free in %v)", d.Round(time.Millisecond))
			} else {
				fmt.Fprint(stdout, " (over: freed at the next sweep)")
			}
		}
		if m.Rejector {
			fmt.Fprint(stdout, "  rejector")
		}
		fmt.Fprintf(stdout, "  steered %d\n", m.Steered)
		var rs []string
		for _, r := range m.Ranges {
			rs = append(rs, fmt.Sprintf("%#06x-%#06x", r[0], r[1]))
		}
		if len(rs) > 0 {
			fmt.Fprintf(stdout, "    QPNs %s\n", strings.Join(rs, " "))
		}
		for _, sid := range m.Services {
			fmt.Fprintf(stdout, "    listens %s\n", serviceName(sid))
		}
	}
	c := st.Counters
	fmt.Fprintf(stdout, "dropped: unowned QPN %d, owner gone %d, no listener %d, unowned comm ID %d, not CM %d, malformed %d; REQs to the rejector %d\n",
		c.UnownedQPN, c.DeadOwner, c.NoListener, c.UnownedComm, c.NotCM, c.Malformed, c.ToRejector)
	return nil
}

// serviceName spells a service ID as rdma_cm does (port space and port).
func serviceName(sid uint64) string {
	ps, port := sid>>16&0xffff, sid&0xffff
	switch {
	case sid>>32 == 0 && ps == 0x0106:
		return fmt.Sprintf("rdma_cm TCP port %d (service %#x)", port, sid)
	case sid>>32 == 0 && ps == 0x0111:
		return fmt.Sprintf("rdma_cm UDP port %d (service %#x)", port, sid)
	}
	return fmt.Sprintf("service %#x", sid)
}

// shareRemove unpins the group on addr:4791 when no member is alive.
func shareRemove(addr netip.Addr, stdout io.Writer) error {
	ap := netip.AddrPortFrom(addr, udp.Port)
	done, err := share.Remove(ap, "")
	if err != nil {
		return err
	}
	if !done {
		return fmt.Errorf("the group on %v has live members", ap)
	}
	fmt.Fprintf(stdout, "removed the group on %v\n", ap)
	return nil
}
