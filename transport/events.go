package transport

import "fmt"

// EventType is the type of an asynchronous event (libibverbs enum
// ibv_event_type values).
type EventType uint8

// Asynchronous event types. The device raises the ones listed with a
// description; the others keep their verbs numbers for future use.
const (
	// EventCQErr: a CQ overflowed; completions were lost.
	EventCQErr EventType = 0
	// EventQPFatal: a QP moved to the error state by itself (not through
	// Modify, Destroy or Close): a failed work request or an overflowing
	// CQ. Err says why; the failed completion, if any, is in the CQ.
	EventQPFatal EventType = 1
	// EventQPReqErr: the QP's responder received an invalid request (it
	// sent an invalid request NAK) and moved to the error state.
	EventQPReqErr EventType = 2
	// EventQPAccessErr: the QP's responder refused a remote access (it
	// sent a remote access error NAK) and moved to the error state.
	EventQPAccessErr EventType = 3
	// EventCommEst: the first packet arrived on a QP in RTR
	// (communication established).
	EventCommEst EventType = 4
	// EventSQDrained: a QP in SQD has no request left outstanding.
	EventSQDrained   EventType = 5
	EventPathMig     EventType = 6
	EventPathMigErr  EventType = 7
	EventDeviceFatal EventType = 8
	EventPortActive  EventType = 9
	EventPortErr     EventType = 10
	EventLIDChange   EventType = 11
	EventPKeyChange  EventType = 12
	EventSMChange    EventType = 13
	EventSRQErr      EventType = 14
	// EventSRQLimitReached: an armed SRQ fell below its limit (SRQ
	// names it); see SRQAttr.Limit.
	EventSRQLimitReached EventType = 15
	// EventQPLastWQEReached: a QP attached to an SRQ entered the error
	// state (by itself or through Modify); the receive WQE it held, if
	// any, has completed (flushed) and it takes no more from the SRQ.
	// Raised once per entry into ERR, not by Destroy or Device.Close;
	// SRQ names the QP's SRQ. Linux's ib_drain_rq waits for it.
	EventQPLastWQEReached EventType = 16
	EventClientReregister EventType = 17
	EventGIDChange        EventType = 18
)

var eventNames = [...]string{
	"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
	"local access violation work queue error", "communication established", "send queue drained",
	"path migrated", "path migration request error", "local catastrophic error", "port active",
	"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
	"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
}

// String returns the ibv_event_type_str text, e.g. "CQ error".
func (t EventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// AsyncEvent is an asynchronous event (ibv_async_event): something that
// happened to a QP or CQ outside any work request's completion.
type AsyncEvent struct {
	Type EventType
	QP   *QP   // the QP for QP events, else nil
	CQ   *CQ   // the CQ for CQ events, else nil
	SRQ  *SRQ  // the SRQ for SRQ events, else nil
	Err  error // the cause, when there is one
}

// String gives the event's type as ibv_event_type_str does, then the QP's
// number for QP events and the cause when there is one, e.g. "local work
// queue catastrophic error on qp 0x12: ...".
func (e AsyncEvent) String() string {
	s := e.Type.String()
	if e.QP != nil {
		s += fmt.Sprintf(" on qp %#x", e.QP.qpn)
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Events returns the device's asynchronous events. The channel holds
// DeviceConfig.EventQueue events; when the application does not keep up,
// newer events are dropped and counted (Counters.AsyncEventsDropped). It
// is closed when the device is closed.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

// raise queues an asynchronous event without blocking.
func (d *Device) raise(e AsyncEvent) {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	if d.evClosed {
		return
	}
	select {
	case d.events <- e:
	default:
		inc(&d.ctr.AsyncEventsDropped)
	}
}

// closeEvents closes the events channel; later events are discarded.
func (d *Device) closeEvents() {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	if !d.evClosed {
		d.evClosed = true
		close(d.events)
	}
}
