package transport

// SendQueued hands the link what the QP has built but not sent yet: the
// ACKs and responses of the received batch the device is still
// delivering. The device wakes a batch's completion waiters before it
// sends what the batch queued (so that an application's answer leaves
// together with the ACKs); a connection manager calls SendQueued before
// its DREQ, so that the DREQ cannot overtake the ACK of a message the
// application has already seen complete. It sends nothing when nothing is
// queued.
func (qp *QP) SendQueued() {
	qp.mu.Lock()
	qp.flushOut()
	qp.mu.Unlock()
	// Responses a received batch took out of the QP to send them with
	// other QPs' (coalesce.go) may be between the QP and the link right
	// now: wait until they are sent.
	qp.dev.respMu.Lock()
	qp.dev.respMu.Unlock()
}
