//go:build linux

package share

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// boundSockets counts the UDP sockets of the calling thread's network
// namespace bound to ap (its address and port), as sock_diag lists them
// (what `ss -uan` shows; no capability needed). A socket on a wildcard
// address is in another reuseport group and does not count.
//
// A process that founds a group checks it first: when the address's pins
// are not where it looks (its own bpffs) and it cannot find the live group
// by enumerating BPF maps (no CAP_SYS_ADMIN), or the group was made by
// another version of this package, the sockets already on the address
// belong to a group it cannot see, and its program attached to its socket
// would replace that group's for every member: their packets dropped as
// unowned.
func boundSockets(ap netip.AddrPort) (int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	defer unix.Close(fd)
	n := 0
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		k, err := dumpUDP(fd, fam, ap)
		if err != nil {
			return 0, err
		}
		n += k
	}
	return n, nil
}

// Sizes of struct nlmsghdr, inet_diag_req_v2 and inet_diag_msg.
const (
	nlmsgHdrLen     = 16
	inetDiagReqLen  = 56
	inetDiagMsgLen  = 72
	inetDiagSockOff = 4 // inet_diag_msg.id
)

// dumpUDP asks for every UDP socket of family fam and counts those bound
// to ap's port on ap's address or a wildcard address.
func dumpUDP(fd int, fam uint8, ap netip.AddrPort) (int, error) {
	req := make([]byte, nlmsgHdrLen+inetDiagReqLen)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], 1) // sequence
	r := req[nlmsgHdrLen:]
	r[0] = fam
	r[1] = unix.IPPROTO_UDP
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag: %w", err)
	}
	addr := ap.Addr().Unmap()
	n := 0
	buf := make([]byte, 1<<16)
	for {
		k, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("sock_diag: %w", err)
		}
		for b := buf[:k]; len(b) >= nlmsgHdrLen; {
			l := int(binary.NativeEndian.Uint32(b[0:]))
			typ := binary.NativeEndian.Uint16(b[4:])
			if l < nlmsgHdrLen || l > len(b) {
				return 0, errors.New("sock_diag: malformed reply")
			}
			switch typ {
			case unix.NLMSG_DONE:
				return n, nil
			case unix.NLMSG_ERROR:
				if l >= nlmsgHdrLen+4 {
					if e := int32(binary.NativeEndian.Uint32(b[nlmsgHdrLen:])); e != 0 {
						return 0, fmt.Errorf("sock_diag: %w", unix.Errno(-e))
					}
				}
				return n, nil
			}
			if m := b[nlmsgHdrLen:l]; len(m) >= inetDiagMsgLen {
				id := m[inetDiagSockOff:]
				sport := binary.BigEndian.Uint16(id[0:])
				var src netip.Addr
				if m[0] == unix.AF_INET {
					src = netip.AddrFrom4([4]byte(id[4:8]))
				} else {
					src = netip.AddrFrom16([16]byte(id[4:20])).Unmap()
				}
				if sport == ap.Port() && src == addr.WithZone("") {
					n++
				}
			}
			if a := (l + 3) &^ 3; a < len(b) {
				b = b[a:]
			} else {
				b = nil
			}
		}
	}
}
