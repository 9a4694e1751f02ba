// Package rdmacm connects queue pairs the way real RDMA applications do:
// through the InfiniBand Communication Manager protocol (IBTA vol. 1
// ch. 12) that librdmacm and the kernel's rdma_cm speak, carried as MADs
// to QP1, with rdma_cm's IP addressing header in the private data. A
// librdmacm peer (rping, ib_write_bw -R, rdma_server, udaddy, NVMe over
// Fabrics, ...) sees ordinary RDMA_CM_EVENT_* events when it talks to a Go
// program that uses this package, and the Go program sees the net package's
// shapes:
//
//   - Listen(dev, port, opts) returns a Listener whose Accept(ctx) returns
//     a connected *Conn (or Next(ctx) a *Request to accept or reject with
//     private data);
//   - Dial(ctx, dev, addr, opts) returns a *Conn that owns a connected RC
//     QP (with its own PD and CQs, or the caller's), or a *RejectError
//     (errors.Is(err, ErrRefused) when nothing listens);
//   - Conn.Close sends a DREQ and waits, bounded, for the DREP; a DREQ
//     from the peer closes Conn.Done();
//   - ResolveUD and ListenUD do the same for UD QPs through SIDR;
//   - NewManager(dev) returns the device's *Manager, whose methods Dial,
//     Listen, ResolveUD and ListenUD the functions above call on the
//     device's manager; it also gives the device's Stats, and Close stops
//     it apart from the device.
//
// A connection ends, and Conn.Done closes with Conn.Err saying why, on
// Close, on the peer's DREQ (ErrDisconnected), when its QP fails
// (ErrQPFailed wrapping the QP's *transport.WCError: retry exceeded,
// remote access error, ...), when the peer answers no keep-alive probe
// (ErrKeepAlive; Options.KeepAlive, on by default: a zero-length RDMA
// WRITE that any verbs peer's QP acknowledges by itself) and when the
// device closes (ErrClosed and transport.ErrClosed). Manager.Close and
// Device.Close tell the peers first, as Linux's rdma_destroy_id does: a
// DREQ for each connection still established, a REJ for each in its
// handshake. A Dial whose REQ (or
// a ResolveUD whose SIDR_REQ) the network bounces (ICMP port unreachable,
// on a socket link) fails at once with ErrUnreachable naming the address.
//
// Cancelling a Dial's context aborts it with the REJ (before the REP) or
// DREQ (after it) that the specification asks for.
//
// # Protocol
//
// One Manager per transport.Device (NewManager(dev), or the one the
// package-level Dial, Listen, ResolveUD and ListenUD start on first use;
// they are thin wrappers over its methods) registers the CM management
// class (0x07) with the device's GSI and runs the state machine of every
// connection of the device (its message handlers are in dispatch.go): REQ, MRA, REJ, REP, RTU, DREQ, DREP and
// SIDR_REQ/SIDR_REP, each retransmitted on its response timeout up to its
// retry count (the peer's first MRA stretches that timeout, within a
// bound, and resets no count: Options.ResponseTimeout, so no peer holds a
// Dial for ever; no REJ but "stale connection" makes it try again, as in
// Linux's CM); duplicates are answered (a duplicate REQ with the REP or an
// MRA, a duplicate REP with the RTU, a duplicate DREQ with the DREP); the
// passive QP is in RTS before its REP leaves (as rdma_accept leaves it),
// and the first packet it receives counts as the RTU (communication
// established); a REQ for a service nobody listens on is answered with a
// REJ (invalid service ID), which librdmacm reports as ECONNREFUSED; a REQ
// from a peer QP (address and QPN) a connection is still known to is
// rejected as stale and that old connection torn down (DREQ, QP to ERR,
// Done closed with ErrStale), so that the peer's next attempt from that QP
// connects (Dial makes it by itself). Ended connections pass through a
// bounded TimeWait; local communication IDs (and the device's QP numbers)
// start at random, so a restarted process does not repeat its previous
// life's and rarely meets that rule: its predecessor's connections end by
// the DREQs the connection journal has it send (JournalEnv), or else by
// keep-alive. A listener sets
// requests up concurrently, bounds each half-open one in time
// (HalfOpenTimeout) and their number (Backlog, shedding the oldest of the
// source holding the most, or dropping the new request when its own
// source holds the most and has nothing unanswered to give up), and
// answers requests (a QP, a REP) only while fewer than Backlog connections wait for Accept (one source holding at
// most half); requests queue apart from answers, fairly per source; a REJ or DREQ ends an established connection only when both
// communication IDs and the address match. Everything the manager drops
// is counted (Stats: REJs by reason, ends by cause, ...). See
// docs/connection-life.md.
//
// Service IDs are rdma_cm's: the TCP port space (0x0106) for RC, the UDP
// port space (0x0111) for UD, port in the low 16 bits. The user part of
// the private data passes through in both directions.
//
// Of this module rdmacm imports cm (the wire format), transport and
// memreg; the commands build on it.
//
// All types are safe for concurrent use.
package rdmacm
