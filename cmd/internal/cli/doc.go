// Package cli is what the subcommands of rocev2d share: exit statuses and
// the Command a family of commands exports; flag parsing the way the C
// tools' getopt_long does (short and long names, options after the
// positional server argument); the socket options (--gso, --busy-poll)
// and congestion control options (--ecn, --cnp-interval, --dcqcn,
// --dcqcn-param) of every command; Endpoint, one RoCEv2 end (a device on
// a UDP socket link, PD, CQs, a QP in INIT, registered memory) and how it
// connects; the counters a command prints with -v and on SIGUSR1; and the
// helpers of the out-of-band TCP exchanges (accept one client, dial from
// --bind).
//
// # Layering
//
// Under cmd/: it builds on the library's public packages (transport,
// memreg, udp, dcqcn) and cmd/internal/pcaptap; rocev2d's main and the
// command families in cmd/internal import it, nothing else does.
package cli
