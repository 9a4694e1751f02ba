// Package transport implements RoCEv2 Reliable Connected queue pairs in
// pure Go, with a verbs-shaped API and the on-the-wire behaviour of Linux
// rdma_rxe.
//
// # Using it
//
// A Device is bound to one udp.Link (a kernel UDP socket, a raw socket or
// the in-memory network) and one local address, its GID. From it come
// protection domains (AllocPD, a memreg.PD in which memory is registered),
// completion queues (CreateCQ), completion channels (CreateCompChannel) and
// queue pairs (CreateQP). A QP is connected with Init and Connect once the
// peer's QPN and PSN are known (by the application's own exchange, as
// ibv_rc_pingpong and perftest do over TCP); work is posted with PostSend
// and PostRecv and completes in the CQs, read with Poll, Wait or through a
// completion channel. Asynchronous events (a QP that failed, a CQ that
// overflowed, communication established, SQ drained, SRQ limit reached,
// last WQE reached for an SRQ QP in ERR) arrive on Device.Events. Errors name the call, the object and the field at fault
// and match the package's sentinels with errors.Is; a refused work request
// is a *WRError (verbs' bad_wr), a failed completion's WC.Err a *WCError.
//
// Every type is safe for concurrent use unless its documentation says
// otherwise; the verbs structs (QPAttr, SendWR, WC, ...) are plain values.
// Close the device to flush every QP, wake every waiter and release the
// link.
//
// # Inside
//
// The device runs one receive goroutine (rxpoll.go, device.go) — or, on a
// udp.SocketLink, the application's own goroutine does its work: a
// CQ.Wait waits in the link's Recv and a polling loop of CQ.Poll or
// Device.Progress (on a busy-polling link at once, on others once it has
// polled spinAfter times with no Wait) receives without blocking, each
// handling the batch
// right there while the receive goroutine parks (rxpoll.go says how they
// hand the link over). Whoever receives reads batches from
// the link, parses each datagram (packet.Decode), routes it by the BTH
// DestQP and counts what it drops (malformed_pkts, unknown_qp,
// transport_mismatch, wrong_state, wrong_peer). A QP follows rxe's split
// into three roles, all under the QP's mutex. Each is a type of its own
// (requester, responder, completer) embedded by value in the QP (QP.req,
// QP.resp, QP.comp) with a pointer back to it: a role's methods own its
// state (PSNs, counts, saved resources), and reach what the roles share —
// the attributes, the send and receive queues, the output queue, the
// device — through the QP:
//
//   - requester.go: turns send WQEs into request packets — segmentation to
//     the path MTU (256..4096), gather from the SGEs straight into pooled
//     packet buffers, AckReq on the last packet of a message and at least
//     every MaxPktsPerAck (64) packets, a window of MaxUnackedPSNs (128)
//     PSNs (MaxUnackedSmallPSNs, 512, for packets of at most 128 bytes,
//     cut back to 128 by a go-back-N rewind and grown back by the PSNs
//     acknowledged), at most max_rd_atomic outstanding READ/atomic
//     requests, fences;
//     rewind (go-back-N restarts from a PSN); a WQE whose local memory
//     fails stops the requester there (failLocal).
//   - responder.go: expected-PSN checks (a PSN behind it is a duplicate,
//     ahead of it out of sequence: one PSN sequence error NAK, then silent
//     drops until the gap closes), opcode sequence checks, receive WQE
//     consumption and scatter, WRITE placement (the target checked once
//     per message; inside a received batch the regions written stay
//     pinned until the batch ends: memreg.Pins), multi-packet READ
//     responses (readresp.go: a quantum at a time, the rest in the QP's
//     scheduler turns, with the requests that arrive meanwhile held and
//     executed after them, so that one huge READ does not stall the
//     device's receive path), atomics, saved responder resources (max_dest_rd_atomic)
//     so that a duplicate READ or atomic is replayed and never executed
//     twice, coalesced ACKs (one per AckReq, MSN = completed messages,
//     credits 0x1f), NAKs for every error class and RNR NAKs. An RC
//     error NAK completes the receive WQE the message had taken with
//     the error's status (a SEND's, or an RDMA WRITE's packet with
//     immediate, which takes it before its rkey check as rxe does) and
//     flushes the rest.
//   - completer.go: cumulative ACKs, implicit ACKs by READ responses and
//     atomic ACKs, in-order completions, the decision to retry (go-back-N
//     on a PSN sequence NAK, on a gap in the responses and on the local
//     ACK timeout) and retry_cnt / rnr_retry (7 = infinite) exhaustion;
//     fatal NAKs complete the WR with the matching status, move the QP to
//     ERR and flush every other outstanding WR with WCWRFlushErr.
//   - timers.go: the local ACK timeout (4.096 µs × 2^timeout) and the RNR
//     back-off, one Timer each per QP, both through the Clock interface
//     (ManualClock drives them in tests without sleeping).
//
// The rest: verbs.go holds the verbs types (states, MTUs, attribute masks,
// work requests), qp.go the QP object (create, destroy, input dispatch,
// settle), modify.go the state machine (Modify and the transition table,
// reset, flush to ERR), connect.go Init and Connect, post.go PostSend and
// PostRecv, output.go the per-QP output batch, cq.go completion queues and
// channels, events.go asynchronous events, wc.go completions and errors,
// counters.go the device counters (rxe's hw_counters names where rxe has
// one).
//
// On a link with zero-copy send (udp.CapZeroCopy, a udp.SocketLink) the
// payload of an RC WRITE or SEND request, or of a READ response, that
// lies in one registered region (one SGE) and is 1 KiB or more is not
// copied: the packet is queued with its headers in a packet buffer and
// its payload a slice of the region (memreg PD.GatherView,
// QPView.ReadView), and the link sends it from there, computing the ICRC
// over it in place. The device reads such a slice only while it holds
// the region (memreg.Hold, around its Link.Send): MR.Deregister (or a
// window's unbind or invalidation) waits for a send in progress, and a
// packet still queued after it is dropped (zero_copy_dropped), never
// sent — a READ's responder has no completion to wait for, so this is
// what makes Deregister safe, mmap'd memory included. (A SEND with
// Invalidate or a LOCAL_INV is executed after the READs before it: the
// READ responses a QP has queued are sent before it invalidates.) As in verbs, memory
// a work request reads must not change until the request has completed;
// a payload changed under an outstanding request leaves with an ICRC the
// receiver rejects (or, in a retransmission, with the new bytes). UC
// requests, which complete when queued, always copy.
// DeviceConfig.CopySend turns zero-copy off; the wire bytes are the same. On a link that can leave the ICRC
// check to its caller (udp.CapDeferVerify), the device checks each
// received packet right before handling it (verify-then-place: no byte
// of a packet whose ICRC fails reaches registered memory, and the
// placement copy reads what the check has just brought into L1;
// DeviceConfig.VerifyInLink keeps the check in the link).
//
// Packets are sent in order per QP, in batches, with the UDP source port
// rxe uses (udp.FlowSourcePort of the local and remote QPN); the link fills
// the ICRC. What one received batch makes a QP send (ACKs, READ responses
// up to a scheduler quantum each, requests the window now admits) leaves
// in one Link.Send at the end of the batch, not one per packet; the batch's completions wake each CQ's
// waiters once, before that flush. When the application's goroutine
// received the batch, its queued ACKs leave with the application's next
// PostSend instead (behind the requests, so that ACK and request form one
// GSO datagram), or at its next receive. In steady state posting and
// completing a message allocates nothing.
//
// RC, UC and UD QPs are implemented, shared receive queues (CreateSRQ),
// memory windows (type 1 bound with QP.BindMW, type 2 with WRBindMW work
// requests, WRLocalInv, SEND with Invalidate), and QP1 (Device.GSI) for
// management datagrams, which refuses CM connection and SIDR requests
// that reach it itself while no CM agent is registered (on a shared
// address udp/share steers CM MADs: when no member runs a connection
// manager, a REQ is dropped before any device sees it and the dialer gets
// ICMP port unreachable); not yet alternate paths.
//
// Loss recovery is go-back-N, as the IBTA and rxe do, unless both QPs
// negotiated selective repeat (QPAttr.SelectiveRepeat, ConnParams, or the
// CM's ECE exchange in package rdmacm): then the responder holds
// out-of-order requests (SRConfig.Window) and answers with selective NAKs
// (an RC ACKNOWLEDGE with a NAK AETH and an aeth.SACK block), and the
// requester resends only what is missing, with IRN's two timeouts and a
// cap on packets in flight (sack.go, docs/SELECTIVE-REPEAT.md). Other peers
// never see a selective NAK.
//
// Of this module transport imports the wire packages (cm for those
// refusals), memreg, and udp for
// its Link interface only (no socket code of its own); the connection
// manager and the commands build on it, never the other way round.
package transport
