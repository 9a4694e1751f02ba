// Package transport implements RoCEv2 Reliable Connected queue pairs in
// pure Go, with a verbs-shaped API and the on-the-wire behaviour of Linux
// rdma_rxe.
//
// A Device is bound to one udp.Link and one local address (its GID). It
// owns a memreg.Table (AllocPD), its CQs and QPs, and one receive goroutine
// that reads batches from the link, parses each datagram with
// packet.Parse and hands it to the QP named by the BTH DestQP. Malformed
// packets and packets for unknown QPs (or QPs in the wrong state, from the
// wrong peer or with a foreign P_Key) are counted and dropped.
//
// A QP follows rxe's split into three roles, all under the QP's mutex:
//
//   - requester.go: turns send WQEs into request packets — segmentation to
//     the path MTU (256..4096), gather from the SGEs straight into pooled
//     packet buffers, AckReq on the last packet of a message and at least
//     every MaxPktsPerAck (64) packets, a window of MaxUnackedPSNs (128)
//     PSNs, at most max_rd_atomic outstanding READ/atomic requests, fences.
//     A READ request consumes one PSN per expected response packet.
//   - responder.go: expected-PSN checks (a PSN behind it is a duplicate,
//     ahead of it out of sequence: one PSN sequence error NAK, then silent
//     drops until the gap closes), opcode sequence checks, receive WQE
//     consumption and scatter, WRITE placement (the target checked once
//     per message; inside a received batch the regions written stay
//     pinned until the batch ends: memreg.Pins), multi-packet READ responses
//     (first/last/only carry the AETH, PSNs start at the request's PSN),
//     atomics, saved responder resources (max_dest_rd_atomic) so that a
//     duplicate READ or atomic is replayed and never executed twice,
//     coalesced ACKs (one per AckReq, MSN = completed messages, credits
//     0x1f), NAKs for every error class and RNR NAKs with min_rnr_timer.
//   - completer.go: cumulative ACKs, implicit ACKs by READ responses and
//     atomic ACKs, in-order completions, go-back-N on a PSN sequence NAK, on
//     a gap in the responses and on the local ACK timeout (4.096 µs ×
//     2^timeout); retry_cnt and rnr_retry (7 = infinite) exhaustion; fatal
//     NAKs complete the WR with the matching status, move the QP to ERR and
//     flush every other outstanding WR with WCWRFlushErr.
//
// Packets are sent in order per QP, in batches, with the UDP source port
// rxe uses (udp.FlowSourcePort of the local and remote QPN); the link fills
// the ICRC. What one received batch makes a QP send (ACKs, READ responses,
// requests the window now admits) leaves in one Link.Send at the end of
// the batch, not one per packet; the batch's completions wake each CQ's
// waiter once, before that flush. In steady state posting and completing a message allocates
// nothing.
//
// All timers go through the Clock interface; ManualClock lets tests drive
// timeouts and RNR back-offs without sleeping.
//
// Counters use rxe's hw_counters names (sent_pkts, rcvd_pkts,
// duplicate_request, out_of_seq_request, rcvd_rnr_err, send_rnr_err,
// rcvd_seq_err, ack_deferred, retry_exceeded_err, retry_rnr_exceeded_err,
// completer_retry_err, rdma_sends, rdma_recvs, ...).
//
// Only RC is implemented: no UC, UD, SRQ, memory-window bind work requests
// or alternate paths.
package transport
