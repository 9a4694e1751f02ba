// Package guardian says goodbye for a killed process: with Enable, every
// rdmacm connection manager that keeps a connection journal
// (rdmacm.JournalEnv) starts a guardian, a small child process that
// outlives its parent only to send the DREQs of the connections the parent
// left established — as Linux's kernel sends them for a killed process's
// cm_ids, and as the next manager on the address would (its journal
// replay, rdmacm.Stats.DREQForDead) — so that a rocev2 process killed
// with SIGKILL (or crashing) and never restarted does not leave its
// peers' connections (a Linux rdma_cm peer's above all, which has no
// keep-alive) established for good.
//
// The guardian is the running binary again (/proc/self/exe), selected by
// the environment variable Env, which this package's init handles before
// any main (docker's reexec pattern): a program, a test binary or a `go
// run` gets it by importing this package. It runs in its own process
// group (a Ctrl-C to the parent's group does not end it first), inherits
// nothing but a pipe to its parent (standard input, output and error are
// /dev/null; every other descriptor is close-on-exec), and blocks on
// that pipe: no network activity, no CPU while the parent lives. The
// pipe's end of file (or PR_SET_PDEATHSIG, checked against getppid) says
// the parent is gone; then:
//
//   - the parent's journal lock is held (the process lives on, the
//     pipe closed by other means): it sends nothing and exits;
//   - the parent's journal is gone or holds no record (its managers
//     closed cleanly, the peers told): it exits at once;
//   - the lock is free and records remain (killed, crashed): it opens a
//     socket link on the parent's address, starts a connection manager
//     there — whose journal replay takes the dead owner's lock and sends
//     each record's DREQ once, paced as a restarted process's would be —
//     waits up to a second for the DREPs, and exits.
//
// Its work after the parent's death is bounded (Limit); a failure (the
// address taken again, say by a restarted process, which then speaks for
// the dead itself) ends it. Linux only: elsewhere Enable does nothing.
package guardian
