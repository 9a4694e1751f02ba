// Package memnet is an in-memory IP network of udp.Links for tests and
// simulators, in the style of wireguard-go's conn/bindtest.
//
//   - MemNetwork / MemLink: links by IP address with seeded, reproducible
//     faults (loss, duplication, reordering, corruption, delay, ECN CE
//     marking; Faults, MemCounters) and a tap that sees every packet sent
//     (SetTap, TapFunc). A MemLink fills and verifies the ICRC exactly as
//     the socket links of package udp do (IPv4 identification 0 with DF).
//   - The switch model (memswitch.go) adds rate-limited queues: a switch
//     egress port toward an address with RED/ECN marking and tail drop
//     (MemNetwork.Bottleneck, SwitchPort, PortStats) and a NIC's line rate
//     (MemLink.Shape).
//   - In virtual time (NewVirtualMemNetwork, Step; memvirtual.go) the
//     network moves packets only when stepped, on the caller's clock, so
//     that a run over it is reproducible from its seed.
//
// # Layering
//
// memnet imports udp (the Link interface and the helpers it exports for
// Link implementations: CheckSend, CheckRecv, ComputeICRC, NormAddr) and
// the wire package icrc. The transport's production code does not import
// it (test/layering checks that `go list -deps ./transport` has no memnet);
// tests, simulators and the demo do.
package memnet
