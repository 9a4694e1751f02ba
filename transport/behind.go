package transport

import (
	"slices"
	"sync"
	"time"
)

// procDevs are the open devices of this process that run on the wall
// clock. A local ACK timer that expires while another of them is behind
// on its input knows this process is short of CPU time: when the peer is
// a device in the same process (tests, a loopback soak), the request or
// the ACK may be waiting there, unread (QP.behind).
var procDevs struct {
	mu   sync.Mutex
	list []*Device
}

// maxBehindCheck bounds the other devices one expiry looks at.
const maxBehindCheck = 32

// registerBehind adds d to procDevs (wall clock only).
func (d *Device) registerBehind() {
	if !d.realClk {
		return
	}
	procDevs.mu.Lock()
	procDevs.list = append(procDevs.list, d)
	procDevs.mu.Unlock()
}

// unregisterBehind removes d from procDevs.
func (d *Device) unregisterBehind() {
	procDevs.mu.Lock()
	if i := slices.Index(procDevs.list, d); i >= 0 {
		procDevs.list = slices.Delete(procDevs.list, i, i+1)
	}
	procDevs.mu.Unlock()
}

// inputBehind reports whether d's receive side has been inside one batch
// for longer than to (on the busy clock, now: busyAge), or datagrams
// wait unread in its link.
func (d *Device) inputBehind(to time.Duration) bool {
	if b := d.rxBusy.Load(); d.realClk && b != 0 && busyAge(b) > to {
		return true
	}
	return d.backlog != nil && d.backlog.RecvBacklog()
}

// othersBehind reports whether another device of this process (at most
// maxBehindCheck of them) is behind on its input (inputBehind).
func (d *Device) othersBehind(to time.Duration) bool {
	procDevs.mu.Lock()
	defer procDevs.mu.Unlock()
	n := 0
	for _, o := range procDevs.list {
		if o == d || o.closed.Load() {
			continue
		}
		if n++; n > maxBehindCheck {
			return false
		}
		if o.inputBehind(to) {
			return true
		}
	}
	return false
}
