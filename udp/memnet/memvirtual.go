package memnet

import (
	"errors"
	"fmt"
	"github.com/gorocev2/rocev2/udp"
	"net"
	"slices"
	"strings"
	"time"
)

// Virtual time
//
// A MemNetwork made by NewVirtualMemNetwork moves packets only when its
// owner calls Step, at the time of the clock it was given, so that a run of
// devices over it is a deterministic function of the seed:
//
//   - Send stamps each packet with the clock's time and stages it on its
//     link; nothing enters the network yet. Packets sent concurrently by
//     different goroutines are kept apart per link, in send order.
//   - Step takes every staged packet and runs the network's events up to
//     the clock's current time, earliest first: packets entering (by send
//     time, ties in link creation order, then send order), departures from
//     transmit lines and switch ports (at their exact departure times),
//     and deliveries off the propagation delay line (Faults.Delay). The
//     random decisions (faults, ECN marks) are drawn in that order.
//   - A delivered packet is appended to its link's receive queue; the
//     packets of one Step reach each link at once (the receiver cannot
//     take part of them early), so a receiver's batches do not depend on
//     goroutine scheduling.
//   - Step then waits until the network is quiescent: every link's receive
//     queue is empty and its receiving goroutine is back, blocked in Recv.
//     What the receivers sent meanwhile is staged at the same time; Step
//     repeats until nothing is left to do at this time.
//
// A harness drives it in a loop: advance the clock to the next event (the
// earliest of NextEvent and the devices' timer deadlines), Step, then read
// completions and post new work from its own goroutine, while every
// receiver is blocked. The ReorderHold timer is wall-clock driven, so the
// Reorder fault is not available in virtual time (it is treated as 0);
// Faults.Delay becomes the propagation delay of every delivery.
//
// Every link of a virtual network must have a goroutine receiving from it
// (a transport Device does) once packets are sent to it, or Step cannot
// become quiescent: it gives up after QuiesceTimeout of wall-clock time
// and returns an error naming the links.

// QuiesceTimeout bounds how long (wall clock) Step waits for the receivers
// of a virtual-time network to go idle.
var QuiesceTimeout = 30 * time.Second

// maxStepCycles bounds the rounds of one Step at one time (each round
// delivers, waits for quiescence and collects what was sent in reply).
const maxStepCycles = 1 << 16

// NewVirtualMemNetwork returns an empty network with the given faults that
// runs in virtual time on the clock now (for example a transport
// ManualClock's Now method): see the section on virtual time above.
func NewVirtualMemNetwork(f Faults, now func() time.Time) *MemNetwork {
	n := NewMemNetwork(f)
	n.vnow = now
	n.vquiet = make(chan struct{}, 1)
	n.faults = n.sanitizeFaults(f)
	n.vlast = now()
	return n
}

// Virtual reports whether the network runs in virtual time.
func (n *MemNetwork) Virtual() bool { return n.vnow != nil }

// now returns the network's time. Called with n.mu held.
func (n *MemNetwork) now() time.Time {
	if n.vnow != nil {
		return n.vnow()
	}
	return time.Now()
}

// stage records packets l sends in virtual time. Called with n.mu held.
func (n *MemNetwork) stage(l *MemLink, pkts []udp.Packet) {
	now := n.vnow()
	for i := range pkts {
		b := l.copyOut(&pkts[i])
		b.at = now
		l.staged = append(l.staged, b)
	}
}

// vforward puts b on the virtual delay line, or delivers it at once
// without a delay. Called with n.mu held.
func (n *MemNetwork) vforward(dst *MemLink, b *memBuf, t time.Time) {
	if n.faults.Delay <= 0 {
		n.vdeliver(dst, b)
		return
	}
	n.ctr.Delayed++
	b.at = t.Add(n.faults.Delay)
	b.dst = dst
	if n.vdh > 0 && n.vdh == len(n.vdelay) {
		n.vdelay, n.vdh = n.vdelay[:0], 0
	}
	n.vdelay = append(n.vdelay, b)
}

// vdeliver appends b to dst's receive queue (dropped as DropOther when the
// link is closed or holds memQueueLen packets) and marks dst busy. Called
// with n.mu held.
func (n *MemNetwork) vdeliver(dst *MemLink, b *memBuf) {
	if dst.closed {
		putMemBuf(b)
		return
	}
	if len(dst.vq)-dst.vqh >= memQueueLen {
		dst.other.Add(1)
		putMemBuf(b)
		return
	}
	dst.vq = append(dst.vq, b)
	if !dst.vbusy {
		dst.vbusy = true
		n.vbusy++
	}
	select {
	case dst.vwake <- struct{}{}:
	default:
	}
}

// idle marks l's receiver as back in Recv with nothing queued. Called with
// n.mu held.
func (l *MemLink) idle() {
	if !l.vbusy {
		return
	}
	l.vbusy = false
	n := l.net
	n.vbusy--
	if n.vbusy == 0 {
		select {
		case n.vquiet <- struct{}{}:
		default:
		}
	}
}

// recvVirtual is Recv in virtual time: it takes up to len(pkts) packets
// from the receive queue, which Step fills, and marks the link idle while
// it blocks.
func (l *MemLink) recvVirtual(pkts []udp.Packet) (int, error) {
	n := l.net
	for {
		n.mu.Lock()
		for l.vqh == len(l.vq) {
			if l.closed {
				n.mu.Unlock()
				return 0, net.ErrClosed
			}
			l.vq, l.vqh = l.vq[:0], 0
			l.idle()
			n.mu.Unlock()
			select {
			case <-l.vwake:
			case <-l.done:
			}
			n.mu.Lock()
		}
		k := min(len(pkts), len(l.vq)-l.vqh)
		l.vtake = append(l.vtake[:0], l.vq[l.vqh:l.vqh+k]...)
		clear(l.vq[l.vqh : l.vqh+k])
		l.vqh += k
		n.mu.Unlock()
		got := 0
		for _, b := range l.vtake {
			if l.accept(b, &pkts[got]) {
				got++
			}
			putMemBuf(b)
		}
		clear(l.vtake)
		if got > 0 {
			l.rcvd.Add(uint64(got))
			return got, nil
		}
	}
}

// closeVirtual releases what a closing link holds in virtual time. Called
// with n.mu held.
func (l *MemLink) closeVirtual() {
	for _, b := range l.staged {
		putMemBuf(b)
	}
	l.staged = nil
	for _, b := range l.vq[l.vqh:] {
		putMemBuf(b)
	}
	l.vq, l.vqh = nil, 0
	if l.vwake != nil {
		l.idle()
	}
	if l.txPort != nil {
		l.txPort.stop()
	}
}

// collect moves every link's staged packets to n.vin, in send-time order
// (ties: link creation order, then send order). Called with n.mu held.
func (n *MemNetwork) collect() {
	added := false
	for _, l := range n.linkList {
		if len(l.staged) > 0 {
			n.vin = append(n.vin, l.staged...)
			clear(l.staged)
			l.staged = l.staged[:0]
			added = true
		}
	}
	if added {
		slices.SortStableFunc(n.vin, func(a, b *memBuf) int { return a.at.Compare(b.at) })
	}
}

// event kinds of runEvents, in tie-break order at equal times.
const (
	evNone = iota
	evPort
	evDelay
	evEnter
)

// nextEvent returns the earliest pending event. Called with n.mu held,
// after collect.
func (n *MemNetwork) nextEvent() (t time.Time, kind int, port *SwitchPort) {
	for _, p := range n.portList {
		if h := p.head(); h != nil && (kind == evNone || h.at.Before(t)) {
			t, kind, port = h.at, evPort, p
		}
	}
	if n.vdh < len(n.vdelay) {
		if a := n.vdelay[n.vdh].at; kind == evNone || a.Before(t) {
			t, kind, port = a, evDelay, nil
		}
	}
	if len(n.vin) > 0 {
		if a := n.vin[0].at; kind == evNone || a.Before(t) {
			t, kind, port = a, evEnter, nil
		}
	}
	if kind != evNone && t.Before(n.vlast) {
		t = n.vlast
	}
	return t, kind, port
}

// runEvents runs every event due by end, earliest first. Called with n.mu held.
func (n *MemNetwork) runEvents(end time.Time) {
	n.collect()
	for {
		t, kind, port := n.nextEvent()
		if kind == evNone || t.After(end) {
			return
		}
		n.vlast = t
		switch kind {
		case evPort:
			port.depart()
		case evDelay:
			b := n.vdelay[n.vdh]
			n.vdelay[n.vdh] = nil
			n.vdh++
			dst := b.dst
			b.dst = nil
			n.vdeliver(dst, b)
		case evEnter:
			b := n.vin[0]
			n.vin[0] = nil
			n.vin = n.vin[1:]
			src := b.link
			if src.txPort != nil {
				src.txPort.enqueue(t, b)
			} else {
				n.enter(src, b, t)
			}
		}
	}
}

// ErrNotVirtual is returned by Step on a network that runs in real time.
var ErrNotVirtual = errors.New("memnet: network is not in virtual time")

// Step runs the network up to the clock's current time (see the section
// on virtual time): it enters every staged packet, lets every departure
// and delivery due by then happen, waits until every receiver is idle
// again, and repeats while the receivers' replies leave something due. It
// must not be called concurrently with itself.
func (n *MemNetwork) Step() error {
	if n.vnow == nil {
		return ErrNotVirtual
	}
	for cycle := 0; cycle < maxStepCycles; cycle++ {
		n.mu.Lock()
		end := n.vnow()
		n.runEvents(end)
		n.mu.Unlock()
		if err := n.waitQuiet(); err != nil {
			return err
		}
		n.mu.Lock()
		n.collect()
		t, kind, _ := n.nextEvent()
		n.mu.Unlock()
		if kind == evNone || t.After(end) {
			return nil
		}
	}
	return fmt.Errorf("memnet: virtual network step: still busy after %d rounds at one time", maxStepCycles)
}

// waitQuiet waits until no link is busy.
func (n *MemNetwork) waitQuiet() error {
	var timer *time.Timer
	for {
		n.mu.Lock()
		busy := n.vbusy
		n.mu.Unlock()
		if busy == 0 {
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		if timer == nil {
			timer = time.NewTimer(QuiesceTimeout)
		}
		select {
		case <-n.vquiet:
		case <-timer.C:
			n.mu.Lock()
			var names []string
			for _, l := range n.linkList {
				if l.vbusy {
					names = append(names, l.addr.String())
				}
			}
			n.mu.Unlock()
			return fmt.Errorf("memnet: virtual network: links %s still busy after %v (no receiver?)", strings.Join(names, ", "), QuiesceTimeout)
		}
	}
}

// NextEvent returns the time of the network's next event: a staged packet
// (it enters at its send time), a departure from a transmit line or switch
// port, or a delivery off the delay line. ok is false when there is none.
// Only meaningful in virtual time.
func (n *MemNetwork) NextEvent() (t time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.vnow == nil {
		return time.Time{}, false
	}
	n.collect()
	t, kind, _ := n.nextEvent()
	return t, kind != evNone
}
