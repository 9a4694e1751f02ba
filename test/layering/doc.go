// Package layering holds one test, TestLayering, that enforces the import
// layering of the module with `go list` (for linux, darwin and windows, so
// that platform files are checked too). Each package's doc comment says its
// job and what it may import; this test is where the rules are written
// down and checked:
//
//   - The wire header packages (bth, reth, aeth, atomiceth, deth, immdt,
//     icrc) import nothing of this module; cm (the CM MAD format) only bth
//     (its path MTU type); packet imports only the header packages;
//     rocelayer only wire packages.
//   - memreg imports only wire packages.
//   - udp imports only wire packages (and internal/netns and udp/share);
//     udp/faults and udp/share only internal/netns; internal/netns nothing
//     of ours. udp/memnet (the
//     in-memory network) imports only wire packages and udp, and neither
//     udp, transport nor rdmacm depends on it, even transitively (`go list
//     -deps ./transport` has no memnet: TestNoSimulatorInProducts).
//   - transport imports only wire packages, memreg and udp, and reaches the
//     network only through udp: no syscall, golang.org/x/sys, golang.org/x/net,
//     os/exec or eBPF imports, and of package net only net.ErrClosed (what a
//     closed udp.Link returns).
//   - examples/ (runnable programs for the README) use only the library's
//     public packages: nothing under cmd/, test/ or internal/.
//   - cmd/ and test/ sit on top: no package outside them imports them —
//     not even in its tests, except test/goldendir, the leaf that finds the
//     golden captures (standard library only) — and cmd/ never imports
//     test/.
//   - Inside cmd/: cmd/rocev2d's main only dispatches (it imports the
//     command packages and cmd/internal/cli, nothing else of the module);
//     a command package (cmd/internal/bench, cmtools, congestion, demo,
//     faultscmd, pcapcmd, perftest, pingpong, scale, sharecmd, soak)
//     imports under cmd/ only the shared packages cli, cpudist, oob, pcaptap
//     and svgplot — never another command package or cmd/internal/clitest,
//     which only tests import; cli imports only pcaptap of cmd/, the other
//     shared packages nothing under cmd/.
//   - Every package of the module falls under a rule, so a new one makes
//     its author decide where it sits.
//
// A violation is reported with the file and the import (or, for net, the
// line and the identifier) that breaks the rule.
package layering
