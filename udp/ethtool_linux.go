//go:build linux

package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// GSO reports whether the link sends same-size runs as UDP GSO datagrams
// (SocketOptions.GSO, or what GSOAuto decided).
func (l *SocketLink) GSO() bool { return l.gso }

// DeviceOffloadOf asks the kernel about the network device with index
// ifindex in the calling thread's network namespace: its name and parent
// device over rtnetlink (RTM_GETLINK), and whether "tx-udp-segmentation" is
// active over ethtool's generic netlink family (ETHTOOL_MSG_FEATURES_GET).
// It needs no privilege.
func DeviceOffloadOf(ifindex int) (DeviceOffload, error) {
	o := DeviceOffload{Index: ifindex}
	name, parent, err := linkInfo(ifindex)
	if err != nil {
		return o, fmt.Errorf("udp: device %d: %w", ifindex, err)
	}
	o.Name, o.Virtual = name, parent == ""
	seg, err := txUDPSegmentation(ifindex)
	if err != nil {
		return o, fmt.Errorf("udp: device %s: ethtool features: %w", name, err)
	}
	o.TxUDPSegmentation = seg
	return o, nil
}

// DeviceOffloadFor finds the device that holds local address addr (the one
// a socket bound to it sends through to on-link peers: lo for 127.0.0.0/8
// and ::1) and returns DeviceOffloadOf it. An address of none of the
// devices, but inside the prefix of one (127.0.0.61 inside lo's
// 127.0.0.1/8), is that device's.
func DeviceOffloadFor(addr netip.Addr) (DeviceOffload, error) {
	ifi, err := deviceOf(addr)
	if err != nil {
		return DeviceOffload{}, err
	}
	return DeviceOffloadOf(ifi)
}

// deviceOf returns the index of the device holding addr.
func deviceOf(addr netip.Addr) (int, error) {
	a := normAddr(addr)
	ifs, err := net.Interfaces()
	if err != nil {
		return 0, fmt.Errorf("udp: interfaces: %w", err)
	}
	best, bestBits := 0, -1
	for _, ifi := range ifs {
		addrs, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, x := range addrs {
			n, ok := x.(*net.IPNet)
			if !ok {
				continue
			}
			p, ok := netip.AddrFromSlice(n.IP)
			if !ok {
				continue
			}
			p = p.Unmap()
			bits, _ := n.Mask.Size()
			pfx := netip.PrefixFrom(p, bits)
			if p == a {
				bits = 129 // the address itself beats any prefix
			}
			if pfx.Contains(a) && bits > bestBits && (a.Zone() == "" || ifi.Name == a.Zone()) {
				best, bestBits = ifi.Index, bits
			}
		}
	}
	if bestBits < 0 {
		return 0, fmt.Errorf("udp: no network device holds %v", addr)
	}
	return best, nil
}

// nlConn is a netlink socket of one protocol, for request/response use.
type nlConn struct {
	fd  int
	seq uint32
}

func dialNetlink(proto int) (*nlConn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	// A reply that never comes must not hang the caller.
	tv := unix.Timeval{Sec: 2}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &nlConn{fd: fd}, nil
}

func (c *nlConn) close() { unix.Close(c.fd) }

// request sends one message of type typ with payload and returns the
// payloads of the replies to it (until NLMSG_DONE for a dump, else the
// first). An NLMSG_ERROR with a non-zero code is returned as its errno.
func (c *nlConn) request(typ, flags uint16, payload []byte) ([][]byte, error) {
	c.seq++
	msg := make([]byte, nlmsgHdrLen+len(payload))
	binary.NativeEndian.PutUint32(msg, uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(msg[8:], c.seq)
	copy(msg[nlmsgHdrLen:], payload)
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 1<<16)
	var out [][]byte
	for range 1024 { // bounded: a dump of more parts than this is not ours
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		ms, err := parseMessages(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if m.seq != c.seq {
				continue // a late reply to an earlier request
			}
			switch m.typ {
			case nlmsgDone:
				return out, nil
			case nlmsgError:
				code, err := nlErrno(m.data)
				if err != nil {
					return nil, err
				}
				if code != 0 {
					return nil, syscall.Errno(-code)
				}
				return out, nil
			}
			out = append(out, append([]byte(nil), m.data...))
			if m.flags&nlmFMulti == 0 {
				return out, nil
			}
		}
	}
	return nil, fmt.Errorf("%w: reply without end", errNetlink)
}

// linkInfo returns the device's name and its parent device's name ("" for
// a virtual device).
func linkInfo(ifindex int) (name, parent string, err error) {
	c, err := dialNetlink(unix.NETLINK_ROUTE)
	if err != nil {
		return "", "", err
	}
	defer c.close()
	req := make([]byte, ifinfomsgSize)
	req[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(req[4:], uint32(ifindex))
	rs, err := c.request(unix.RTM_GETLINK, 0, req)
	if err != nil {
		return "", "", fmt.Errorf("RTM_GETLINK: %w", err)
	}
	if len(rs) == 0 || len(rs[0]) < ifinfomsgSize {
		return "", "", fmt.Errorf("RTM_GETLINK: %w: short reply", errNetlink)
	}
	as, err := parseAttrs(rs[0][ifinfomsgSize:])
	if err != nil {
		return "", "", err
	}
	if v, ok := attr(as, unix.IFLA_IFNAME); ok {
		name = nlString(v)
	}
	if v, ok := attr(as, unix.IFLA_PARENT_DEV_NAME); ok {
		parent = nlString(v)
	}
	return name, parent, nil
}

// txUDPSegmentation reports whether "tx-udp-segmentation" is active on the
// device.
func txUDPSegmentation(ifindex int) (bool, error) {
	c, err := dialNetlink(unix.NETLINK_GENERIC)
	if err != nil {
		return false, err
	}
	defer c.close()
	fam, err := c.genlFamily(unix.ETHTOOL_GENL_NAME)
	if err != nil {
		return false, err
	}
	hdr := putAttr(nil, unix.ETHTOOL_A_HEADER_DEV_INDEX, u32Bytes(uint32(ifindex)))
	req := []byte{unix.ETHTOOL_MSG_FEATURES_GET, unix.ETHTOOL_GENL_VERSION, 0, 0}
	req = putAttr(req, unix.ETHTOOL_A_FEATURES_HEADER|unix.NLA_F_NESTED, hdr)
	rs, err := c.request(fam, 0, req)
	if err != nil {
		return false, fmt.Errorf("ETHTOOL_MSG_FEATURES_GET: %w", err)
	}
	if len(rs) == 0 || len(rs[0]) < genlHdrLen {
		return false, fmt.Errorf("ETHTOOL_MSG_FEATURES_GET: %w: short reply", errNetlink)
	}
	on, found, err := featureActive(rs[0][genlHdrLen:], "tx-udp-segmentation")
	if err != nil {
		return false, err
	}
	if !found {
		return false, nil // a kernel without the feature: segmented in software
	}
	return on, nil
}

// genlFamily resolves a generic netlink family name to its id.
func (c *nlConn) genlFamily(name string) (uint16, error) {
	req := []byte{unix.CTRL_CMD_GETFAMILY, 1, 0, 0}
	req = putAttr(req, unix.CTRL_ATTR_FAMILY_NAME, append([]byte(name), 0))
	rs, err := c.request(unix.GENL_ID_CTRL, 0, req)
	if err != nil {
		return 0, fmt.Errorf("generic netlink family %q: %w", name, err)
	}
	if len(rs) == 0 || len(rs[0]) < genlHdrLen {
		return 0, fmt.Errorf("generic netlink family %q: %w: short reply", name, errNetlink)
	}
	as, err := parseAttrs(rs[0][genlHdrLen:])
	if err != nil {
		return 0, err
	}
	v, ok := attr(as, unix.CTRL_ATTR_FAMILY_ID)
	if !ok || len(v) < 2 {
		return 0, fmt.Errorf("generic netlink family %q: %w: no id", name, errNetlink)
	}
	return binary.NativeEndian.Uint16(v), nil
}
