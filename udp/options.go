package udp

import "time"

// SocketOptions configures ListenSocket. The zero value is sensible; nil
// options mean the zero value. The type is defined on every platform so
// that programs configuring it build everywhere; the socket backend itself
// is Linux-only (elsewhere ListenSocket returns errors.ErrUnsupported).
type SocketOptions struct {
	// RecvBufferSize sets SO_RCVBUF in bytes (with SO_RCVBUFFORCE when the
	// process may, so net.core.rmem_max does not cap it). 0 means 8 MiB.
	RecvBufferSize int
	// SendBufferSize sets SO_SNDBUF in bytes (with SO_SNDBUFFORCE when the
	// process may, so net.core.wmem_max does not cap it). 0 means 8 MiB.
	SendBufferSize int
	// BatchSize is the number of datagrams per sendmmsg/recvmmsg call.
	// 0 means 64. With GSO a sent datagram holds a group of packets: a
	// group ends at the latest at every BatchSize-th packet of a Send, and
	// one sendmmsg carries up to BatchSize groups: as many whole groups as
	// its iovecs hold (room for 256 packets at three iovecs each).
	BatchSize int
	// GSO sends runs of consecutive packets with the same destination, TOS
	// and size as one UDP GSO datagram (UDP_SEGMENT), which the kernel
	// splits; about twice the packet rate of plain sendmmsg. Linux numbers
	// the segments' IPv4 identifications 0, 1, 2, ... and Send computes each
	// ICRC for that (verified on the wire through a veth that segments in
	// software, TestGSOOnVethWire). Off by default: a NIC doing the
	// segmentation itself (USO) must number IDs the same way — check such a
	// path with a capture first.
	GSO bool
	// GSOAuto lets ListenSocket decide GSO (GSO is then ignored): on where
	// the kernel segments, off where a NIC does. It asks the device that
	// holds the local address (DeviceOffloadFor): lo, veth and other
	// virtual devices hand a GSO datagram through whole (the receiver
	// splits it, or takes it as one GRO buffer), and a NIC without
	// "tx-udp-segmentation" gets segments the kernel cut, numbered as
	// Send expects; a NIC with it segments in hardware, which GSO then
	// leaves off. When the query fails GSO stays off.
	// SocketLink.GSO tells the outcome.
	GSOAuto bool
	// SourcePorts sends each packet from its Packet.SrcPort (rxe uses one
	// source port per QP, so a QP is one flow for ECMP and RSS): a send-only
	// socket bound to addr:SrcPort is opened on first use of each port.
	// When a port cannot be bound (taken by another socket), and for
	// SrcPort 0 or 4791, packets leave from the link's SendPort instead.
	// Without SourcePorts every packet leaves from SendPort. Either way the
	// ICRC is computed for the port actually used.
	SourcePorts bool
	// NoGRO turns UDP GRO off. By default the socket has UDP_GRO: the
	// kernel may hand over a run of same-flow, same-size, same-TOS datagrams
	// as one buffer (always from a GSO sender on lo; from a NIC when its
	// NAPI batches them), which Recv splits into packets again. Receives
	// then go through the link's own 64 KiB buffers, BatchSize of them (4 MiB
	// of address space by default; pages become resident only as coalesced
	// datagrams fill them), and are copied out. With NoGRO, recvmmsg writes
	// into the caller's buffers.
	NoGRO bool
	// NoZeroCopy turns zero-copy send off: Send then refuses packets
	// whose payload is held outside Buf (Packet.Payload), so a device
	// copies every payload into its packet buffers. By default the link
	// sends such a payload from where it lies (ZeroCopyLink): each
	// packet is one to three iovecs of the datagram (headers, payload,
	// pad and ICRC), the ICRC computed over the payload in place.
	NoZeroCopy bool
	// BusyPoll makes Recv poll the socket without blocking (yielding to
	// other goroutines between tries) for up to this long before it waits
	// through Go's poller: CPU for latency, like the ibv_poll_cq loops of
	// ibv_rc_pingpong and perftest's latency tests. Waking an idle thread
	// is what a blocked Recv costs; on the 2-vCPU development VM 100 µs
	// took an 8-byte ping-pong between two processes from ~90 to ~23 µs.
	// 0 (the default) never polls.
	BusyPoll time.Duration
	// Share selects whether other processes may use the same address:
	// ShareAuto (the zero value) shares where the process may load the
	// steering program (CAP_BPF and CAP_NET_ADMIN, CAP_SYS_ADMIN standing
	// for either) and opens the address
	// for this link alone where it may not; ShareOn requires sharing and
	// fails at once without the capabilities; ShareOff never shares.
	// A shared link joins the SO_REUSEPORT group of addr:4791, whose
	// eBPF program hands each datagram to the process that owns its
	// destination QP (package udp/share); see SocketLink.Shared.
	Share ShareMode
	// ShareTimeWait is how long the QPN ranges of a shared link that
	// closed (or whose process died) stay unused, their packets dropped,
	// before another process may lease them. 0 means 3 s.
	ShareTimeWait time.Duration
}

// ShareMode is SocketOptions.Share.
type ShareMode int

const (
	// ShareAuto shares the address when the process may, else opens it
	// unshared.
	ShareAuto ShareMode = iota
	// ShareOn shares the address or fails.
	ShareOn
	// ShareOff opens the address for this link alone (today's
	// behaviour: a second process gets EADDRINUSE).
	ShareOff
)

// String returns "auto", "on" or "off".
func (m ShareMode) String() string {
	switch m {
	case ShareAuto:
		return "auto"
	case ShareOn:
		return "on"
	case ShareOff:
		return "off"
	}
	return "ShareMode(?)"
}

// RawOptions configures ListenRaw. The zero value is sensible; nil options
// mean the zero value. Like SocketOptions it is defined on every platform;
// the raw backend is Linux-only.
type RawOptions struct {
	// RecvBufferSize sets SO_RCVBUF of the receiving raw socket in bytes
	// (forced past the sysctl limit when the process may). 0 means 8 MiB.
	RecvBufferSize int
	// SendBufferSize sets SO_SNDBUF of the sending socket in bytes (forced
	// past the sysctl limit when the process may). 0 means 8 MiB.
	SendBufferSize int
	// BatchSize is the number of datagrams per sendmmsg/recvmmsg call.
	// 0 means 64.
	BatchSize int
	// TTL of sent packets; 0 means 64 (what rxe sends).
	TTL uint8
	// BusyPoll makes Recv poll for up to this long before it waits, as
	// SocketOptions.BusyPoll. 0 never polls.
	BusyPoll time.Duration
}
