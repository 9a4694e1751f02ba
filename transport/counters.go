package transport

import "sync/atomic"

// Counters are the device's protocol statistics. Names follow the Linux rxe
// hw_counters (sent_pkts, rcvd_pkts, duplicate_request, ...). All fields are
// updated atomically; read them through Device.Counters.
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
	MalformedPkts       uint64 // malformed_pkts: packets that did not parse
	UnknownQP           uint64 // unknown_qp: packets for a QPN with no QP (or wrong state/peer)
	RetransmittedPkts   uint64 // retransmitted_pkts: request packets sent more than once
}

// Counter is one named counter value.
type Counter struct {
	Name  string
	Value uint64
}

// List returns the counters as name/value pairs in a fixed order, named as
// rxe names them.
func (c Counters) List() []Counter {
	return []Counter{
		{"sent_pkts", c.SentPkts},
		{"rcvd_pkts", c.RcvdPkts},
		{"duplicate_request", c.DuplicateRequest},
		{"out_of_seq_request", c.OutOfSeqRequest},
		{"rcvd_rnr_err", c.RcvdRNRErr},
		{"send_rnr_err", c.SendRNRErr},
		{"rcvd_seq_err", c.RcvdSeqErr},
		{"ack_deferred", c.AckDeferred},
		{"retry_exceeded_err", c.RetryExceededErr},
		{"retry_rnr_exceeded_err", c.RetryRNRExceededErr},
		{"completer_retry_err", c.CompleterRetryErr},
		{"send_err", c.SendErr},
		{"rdma_sends", c.RDMASends},
		{"rdma_recvs", c.RDMARecvs},
		{"local_ack_timeout_err", c.LocalAckTimeout},
		{"malformed_pkts", c.MalformedPkts},
		{"unknown_qp", c.UnknownQP},
		{"retransmitted_pkts", c.RetransmittedPkts},
	}
}

// snapshot returns an atomic copy of the live counters.
func (c *Counters) snapshot() Counters {
	return Counters{
		SentPkts:            atomic.LoadUint64(&c.SentPkts),
		RcvdPkts:            atomic.LoadUint64(&c.RcvdPkts),
		DuplicateRequest:    atomic.LoadUint64(&c.DuplicateRequest),
		OutOfSeqRequest:     atomic.LoadUint64(&c.OutOfSeqRequest),
		RcvdRNRErr:          atomic.LoadUint64(&c.RcvdRNRErr),
		SendRNRErr:          atomic.LoadUint64(&c.SendRNRErr),
		RcvdSeqErr:          atomic.LoadUint64(&c.RcvdSeqErr),
		AckDeferred:         atomic.LoadUint64(&c.AckDeferred),
		RetryExceededErr:    atomic.LoadUint64(&c.RetryExceededErr),
		RetryRNRExceededErr: atomic.LoadUint64(&c.RetryRNRExceededErr),
		CompleterRetryErr:   atomic.LoadUint64(&c.CompleterRetryErr),
		SendErr:             atomic.LoadUint64(&c.SendErr),
		RDMASends:           atomic.LoadUint64(&c.RDMASends),
		RDMARecvs:           atomic.LoadUint64(&c.RDMARecvs),
		LocalAckTimeout:     atomic.LoadUint64(&c.LocalAckTimeout),
		MalformedPkts:       atomic.LoadUint64(&c.MalformedPkts),
		UnknownQP:           atomic.LoadUint64(&c.UnknownQP),
		RetransmittedPkts:   atomic.LoadUint64(&c.RetransmittedPkts),
	}
}

func inc(p *uint64) { atomic.AddUint64(p, 1) }
