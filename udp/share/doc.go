// Package share lets many processes use one IP address's UDP port 4791:
// their receive sockets form an SO_REUSEPORT group, and an SK_REUSEPORT
// eBPF program (built in Go with cilium/ebpf's asm package, no clang)
// hands each datagram to the socket of the process that owns it — by the
// BTH destination QP (UDP payload bytes 5-7), and for QP1 (the CM) by the
// service ID of a REQ/SIDR_REQ or by the owner bits of the communication
// ID the other CM messages are addressed to.
//
// The first member of an address loads the program and pins it and its maps
// in bpffs (DefaultPinRoot/rocev2/share-v2/NETNS_ADDR_PORT); later members load
// the pins. A process that would found a group on an address whose sockets
// belong to a group it cannot see fails with ErrAddrInUse instead. Members take a slot (the index of their socket in a
// REUSEPORT_SOCKARRAY), lease QPN ranges of RangeSize QPNs, claim service
// IDs and may volunteer to answer REQs nobody listens on. A member that
// closes or dies (its socket left the array: the kernel removes a closed
// socket) keeps its slot
// and ranges for a TimeWait during which their datagrams are dropped and
// counted, never delivered to another process. Changes to the group happen
// under a per-address lock file. A group whose members are all gone is
// unpinned by a later Sweep (Join runs one per process): a group of
// processes that were killed does not stay in bpffs until reboot.
//
// Loading the program needs CAP_BPF (or CAP_SYS_ADMIN) and CAP_NET_ADMIN;
// Join fails at once with ErrCapability when they are missing.
//
// # Place in the module
//
// package udp uses it for SocketLink (SocketOptions.Share); `rocev2d share
// status` prints ReadStatus. It imports nothing of this module: cilium/ebpf,
// golang.org/x/sys and the standard library. Linux only.
package share
