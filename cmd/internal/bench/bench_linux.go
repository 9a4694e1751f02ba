//go:build linux

package bench

import (
	"encoding/binary"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawGSOSupported: the GSO+GRO raw baseline runs here.
const rawGSOSupported = true

// enableGRO sets UDP_GRO on c: the kernel may hand over a run of
// datagrams of one flow as one buffer, with their size in a UDP_GRO
// control message.
func enableGRO(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) }); err != nil {
		return err
	}
	return serr
}

// gsoCmsg returns a UDP_SEGMENT control message for segments of size bytes.
func gsoCmsg(size int) []byte {
	b := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(b[unix.CmsgLen(0):], uint16(size))
	return b
}

// groSegment returns the segment size of a UDP_GRO control message in oob,
// or 0 when there is none (the buffer is one datagram).
func groSegment(oob []byte) int {
	ms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range ms {
		if m.Header.Level == unix.IPPROTO_UDP && m.Header.Type == unix.UDP_GRO && len(m.Data) >= 4 {
			return int(int32(binary.NativeEndian.Uint32(m.Data)))
		}
	}
	return 0
}

// processCPU returns the user plus system CPU time of the process (every
// thread).
func processCPU() (time.Duration, bool) {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
