package transport

import "sync/atomic"

// Counters are the device's protocol statistics. Names follow the Linux rxe
// hw_counters (sent_pkts, rcvd_pkts, duplicate_request, ...) where rxe has
// one. All fields are updated atomically; read them through
// Device.Counters, which returns a consistent-per-field snapshot.
type Counters struct {
	SentPkts            uint64 // sent_pkts: packets handed to the link
	RcvdPkts            uint64 // rcvd_pkts: packets received for an existing QP
	DuplicateRequest    uint64 // duplicate_request: responder saw a request PSN behind the expected PSN
	OutOfSeqRequest     uint64 // out_of_seq_request: responder sent a PSN sequence error NAK
	RcvdRNRErr          uint64 // rcvd_rnr_err: requester received an RNR NAK
	SendRNRErr          uint64 // send_rnr_err: responder sent an RNR NAK
	RcvdSeqErr          uint64 // rcvd_seq_err: requester received a PSN sequence error NAK
	AckDeferred         uint64 // ack_deferred: request packets accepted without AckReq (ACK coalesced)
	RetryExceededErr    uint64 // retry_exceeded_err: retry_cnt exhausted
	RetryRNRExceededErr uint64 // retry_rnr_exceeded_err: rnr_retry exhausted
	CompleterRetryErr   uint64 // completer_retry_err: go-back-N retransmissions started
	SendErr             uint64 // send_err: link Send failures
	RDMASends           uint64 // rdma_sends: SEND messages completed by the requester
	RDMARecvs           uint64 // rdma_recvs: receive WQEs consumed by the responder
	LocalAckTimeout     uint64 // local_ack_timeout_err: local ACK timer expirations that retried
	MalformedPkts       uint64 // malformed_pkts: packets that did not parse (and ACKs with AETH's reserved syndrome type)
	UnknownQP           uint64 // unknown_qp: packets for a QPN the device does not have
	TransportMismatch   uint64 // transport_mismatch: packets whose transport (UC, UD) the QP does not run
	WrongState          uint64 // wrong_state: packets for a QP in RESET, INIT or ERR
	WrongPeer           uint64 // wrong_peer: packets from an address other than the QP's peer, or with a foreign P_Key
	RetransmittedPkts   uint64 // retransmitted_pkts: request packets sent more than once
	RecvErr             uint64 // recv_err: link Recv failures (Device.LastRecvError has the last)
	CQOverflow          uint64 // cq_overflow: completions lost to a full CQ
	AsyncEventsDropped  uint64 // async_events_dropped: events lost because Events() was full
	QKeyViolation       uint64 // qkey_violation: UD datagrams whose Q_Key is not the QP's
	UDNoRecvWQE         uint64 // ud_no_recv_wqe: UD datagrams dropped for want of a receive WQE
	UCMsgsDropped       uint64 // uc_msgs_dropped: UC messages the responder dropped (a lost packet, no receive WQE, a receive WQE too short, an access error)
	UDMsgsDropped       uint64 // ud_msgs_dropped: UD datagrams dropped because they are longer than the receive WQE (with the GRH); the WQE stays posted and the QP in RTS
	UDMTUExceeded       uint64 // ud_mtu_exceeded: UD datagrams dropped because their payload is longer than the port MTU (DeviceConfig.PortMTU), before a receive WQE is taken
	MADSent             uint64 // mad_sent: MADs the GSI (QP1) sent
	MADRcvd             uint64 // mad_rcvd: MADs the GSI passed to an agent
	MADDropQKey         uint64 // mad_drop_qkey: datagrams to QP1 without the GSI Q_Key
	MADDropSize         uint64 // mad_drop_size: datagrams to QP1 that are not 256 bytes
	MADDropVersion      uint64 // mad_drop_version: MADs with a base version other than 1
	MADDropNoAgent      uint64 // mad_drop_no_agent: MADs of a class (or response TID) no agent takes
	MADDropQueueFull    uint64 // mad_drop_queue_full: MADs dropped because their agent's queue was full
	KeepAliveProbes     uint64 // keep_alive_probes: zero-length RDMA WRITE probes QP.Probe posted
	DestUnreachable     uint64 // dest_unreachable: ICMP port/host unreachable errors the link reported for packets sent
	AckTimeoutLate      uint64 // ack_timeout_late: ACK timer expiries that ran more than a timeout late (the process was not scheduled); they resend without spending retry_cnt
	AckTimeoutBusy      uint64 // ack_timeout_busy: ACK timer expiries during a READ's go-back-N while the rest of the old response flight kept arriving; they spend no retry_cnt and resend nothing
	ZeroCopyDropped     uint64 // zero_copy_dropped: zero-copy packets not sent because their memory was deregistered (MR deregistered, window unbound or invalidated) after they were queued
	InboxDeferred       uint64 // handle_packet_deferred: packets HandlePacket left to the device's own goroutine because they were given from inside a Link.Send (a Link delivering in process) and their QP was busy while a Send of the device was under way
	InboxDropped        uint64 // handle_packet_dropped: packets HandlePacket dropped because 4096 were already left to the device's goroutine

	// The send scheduler's budget (sched.go, docs/SCHEDULER.md): not rxe
	// counters, rxe having no device-wide budget.
	SchedFullNs      uint64 // sched_full_ns: nanoseconds the send scheduler held its queued QPs back because the device's unacknowledged packets filled its budget (SchedInflight); growing at the wall clock's pace, the budget is what limits the device
	SchedForcedTurns uint64 // sched_forced_turns: times the budget stayed full for 5 ms with no ACK freeing room and no stale QP found, and one QP was served anyway
	SchedStaleQPs    uint64 // sched_stale_qps: times a QP's unacknowledged PSNs stopped counting against the budget because its oldest had waited for its ACK longer than a quarter of its ACK timeout (a slow or silent peer)

	NPECNMarkedRocePackets uint64 // np_ecn_marked_roce_packets: packets for an RC/UC QP that arrived marked CE
	NPCNPSent              uint64 // np_cnp_sent: CNPs the notification point sent
	RPCNPHandled           uint64 // rp_cnp_handled: CNPs a QP's reaction point acted on
	RPCNPIgnored           uint64 // rp_cnp_ignored: CNPs ignored (DCQCN off, a UD QP, not from the QP's peer)

	SRHeld        uint64 // sr_held: out-of-order requests a selective repeat responder held
	SROutOfWindow uint64 // sr_out_of_window: out-of-order requests beyond the window, dropped
	SRHoldFull    uint64 // sr_hold_full: out-of-order requests dropped because the device's QPs held SRConfig.MaxHeld packets
	SRSACKSent    uint64 // sr_sack_sent: selective NAKs (with a SACK block) sent
	SRSACKRcvd    uint64 // sr_sack_rcvd: selective NAKs received
	SRRecoveries  uint64 // sr_recoveries: selective resend rounds (each resends only missing PSNs)

	RespHeld        uint64 // resp_held: requests held behind a READ response under way, executed after it
	RespHeldDropped uint64 // resp_held_dropped: requests dropped because their QP (or the device) held as many as it may behind READ responses
}

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
}

// counterFields names every counter, in List order; List and snapshot
// both read it, so a new counter is added here and in the struct only.
var counterFields = []struct {
	name string
	f    func(*Counters) *uint64
}{
	{"sent_pkts", func(c *Counters) *uint64 { return &c.SentPkts }},
	{"rcvd_pkts", func(c *Counters) *uint64 { return &c.RcvdPkts }},
	{"duplicate_request", func(c *Counters) *uint64 { return &c.DuplicateRequest }},
	{"out_of_seq_request", func(c *Counters) *uint64 { return &c.OutOfSeqRequest }},
	{"rcvd_rnr_err", func(c *Counters) *uint64 { return &c.RcvdRNRErr }},
	{"send_rnr_err", func(c *Counters) *uint64 { return &c.SendRNRErr }},
	{"rcvd_seq_err", func(c *Counters) *uint64 { return &c.RcvdSeqErr }},
	{"ack_deferred", func(c *Counters) *uint64 { return &c.AckDeferred }},
	{"retry_exceeded_err", func(c *Counters) *uint64 { return &c.RetryExceededErr }},
	{"retry_rnr_exceeded_err", func(c *Counters) *uint64 { return &c.RetryRNRExceededErr }},
	{"completer_retry_err", func(c *Counters) *uint64 { return &c.CompleterRetryErr }},
	{"send_err", func(c *Counters) *uint64 { return &c.SendErr }},
	{"rdma_sends", func(c *Counters) *uint64 { return &c.RDMASends }},
	{"rdma_recvs", func(c *Counters) *uint64 { return &c.RDMARecvs }},
	{"local_ack_timeout_err", func(c *Counters) *uint64 { return &c.LocalAckTimeout }},
	{"malformed_pkts", func(c *Counters) *uint64 { return &c.MalformedPkts }},
	{"unknown_qp", func(c *Counters) *uint64 { return &c.UnknownQP }},
	{"transport_mismatch", func(c *Counters) *uint64 { return &c.TransportMismatch }},
	{"wrong_state", func(c *Counters) *uint64 { return &c.WrongState }},
	{"wrong_peer", func(c *Counters) *uint64 { return &c.WrongPeer }},
	{"retransmitted_pkts", func(c *Counters) *uint64 { return &c.RetransmittedPkts }},
	{"recv_err", func(c *Counters) *uint64 { return &c.RecvErr }},
	{"cq_overflow", func(c *Counters) *uint64 { return &c.CQOverflow }},
	{"async_events_dropped", func(c *Counters) *uint64 { return &c.AsyncEventsDropped }},
	{"qkey_violation", func(c *Counters) *uint64 { return &c.QKeyViolation }},
	{"ud_no_recv_wqe", func(c *Counters) *uint64 { return &c.UDNoRecvWQE }},
	{"uc_msgs_dropped", func(c *Counters) *uint64 { return &c.UCMsgsDropped }},
	{"ud_msgs_dropped", func(c *Counters) *uint64 { return &c.UDMsgsDropped }},
	{"ud_mtu_exceeded", func(c *Counters) *uint64 { return &c.UDMTUExceeded }},
	{"mad_sent", func(c *Counters) *uint64 { return &c.MADSent }},
	{"mad_rcvd", func(c *Counters) *uint64 { return &c.MADRcvd }},
	{"mad_drop_qkey", func(c *Counters) *uint64 { return &c.MADDropQKey }},
	{"mad_drop_size", func(c *Counters) *uint64 { return &c.MADDropSize }},
	{"mad_drop_version", func(c *Counters) *uint64 { return &c.MADDropVersion }},
	{"mad_drop_no_agent", func(c *Counters) *uint64 { return &c.MADDropNoAgent }},
	{"mad_drop_queue_full", func(c *Counters) *uint64 { return &c.MADDropQueueFull }},
	{"keep_alive_probes", func(c *Counters) *uint64 { return &c.KeepAliveProbes }},
	{"dest_unreachable", func(c *Counters) *uint64 { return &c.DestUnreachable }},
	{"ack_timeout_late", func(c *Counters) *uint64 { return &c.AckTimeoutLate }},
	{"ack_timeout_busy", func(c *Counters) *uint64 { return &c.AckTimeoutBusy }},
	{"zero_copy_dropped", func(c *Counters) *uint64 { return &c.ZeroCopyDropped }},
	{"handle_packet_deferred", func(c *Counters) *uint64 { return &c.InboxDeferred }},
	{"handle_packet_dropped", func(c *Counters) *uint64 { return &c.InboxDropped }},
	{"sched_full_ns", func(c *Counters) *uint64 { return &c.SchedFullNs }},
	{"sched_forced_turns", func(c *Counters) *uint64 { return &c.SchedForcedTurns }},
	{"sched_stale_qps", func(c *Counters) *uint64 { return &c.SchedStaleQPs }},
	{"np_ecn_marked_roce_packets", func(c *Counters) *uint64 { return &c.NPECNMarkedRocePackets }},
	{"np_cnp_sent", func(c *Counters) *uint64 { return &c.NPCNPSent }},
	{"rp_cnp_handled", func(c *Counters) *uint64 { return &c.RPCNPHandled }},
	{"rp_cnp_ignored", func(c *Counters) *uint64 { return &c.RPCNPIgnored }},
	{"sr_held", func(c *Counters) *uint64 { return &c.SRHeld }},
	{"sr_out_of_window", func(c *Counters) *uint64 { return &c.SROutOfWindow }},
	{"sr_hold_full", func(c *Counters) *uint64 { return &c.SRHoldFull }},
	{"sr_sack_sent", func(c *Counters) *uint64 { return &c.SRSACKSent }},
	{"sr_sack_rcvd", func(c *Counters) *uint64 { return &c.SRSACKRcvd }},
	{"sr_recoveries", func(c *Counters) *uint64 { return &c.SRRecoveries }},
	{"resp_held", func(c *Counters) *uint64 { return &c.RespHeld }},
	{"resp_held_dropped", func(c *Counters) *uint64 { return &c.RespHeldDropped }},
}

// List returns the counters as name/value pairs in a fixed order, named as
// rxe names them.
func (c Counters) List() []Counter {
	l := make([]Counter, len(counterFields))
	for i, f := range counterFields {
		l[i] = Counter{f.name, *f.f(&c)}
	}
	return l
}

// snapshot returns an atomic copy of the live counters.
func (c *Counters) snapshot() Counters {
	var s Counters
	for _, f := range counterFields {
		*f.f(&s) = atomic.LoadUint64(f.f(c))
	}
	return s
}

func inc(p *uint64) { atomic.AddUint64(p, 1) }
