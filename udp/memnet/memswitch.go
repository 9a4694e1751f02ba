package memnet

import (
	"fmt"
	"github.com/gorocev2/rocev2/udp"
	"math"
	"net/netip"
	"time"
)

// Bottleneck configures a queue of a MemNetwork that drains at a fixed
// rate: the egress port of a switch toward one address
// (MemNetwork.Bottleneck) or a NIC's transmit line (MemLink.Shape).
//
// Sizes count IP datagrams, as a switch's buffer and a link's rate do:
// the RoCEv2 UDP payload (BTH .. ICRC) plus 8 bytes of UDP header plus 20
// (IPv4) or 40 (IPv6) bytes of IP header. Ethernet framing is not counted.
//
// Marking follows RED with ECN as DCQCN's switch configuration uses it,
// on the instantaneous queue depth q (bytes queued, including the packet
// being sent) seen by a packet when it arrives:
//
//	q <= Kmin:        probability 0
//	Kmin < q <= Kmax: Pmax·(q−Kmin)/(Kmax−Kmin)
//	q > Kmax:         1
//
// Only ECN-capable packets (ECT(0), ECT(1)) are marked CE; a packet that
// does not fit in Buffer is dropped (tail drop), whatever its ECN field.
type Bottleneck struct {
	// Rate is the drain rate in bits per second of IP datagrams; > 0.
	Rate float64
	// Buffer is the queue's capacity in bytes; 0 means unlimited (a NIC's
	// transmit queue, which never drops its own packets).
	Buffer int
	// Kmin and Kmax are the marking thresholds in bytes; Kmax == 0 turns
	// marking off. 0 <= Kmin <= Kmax.
	Kmin, Kmax int
	// Pmax is the marking probability at Kmax, in [0, 1].
	Pmax float64
}

func (b Bottleneck) check() error {
	switch {
	case !(b.Rate > 0) || math.IsInf(b.Rate, 0):
		return fmt.Errorf("memnet: bottleneck rate %v must be > 0 and finite", b.Rate)
	case b.Buffer < 0:
		return fmt.Errorf("memnet: bottleneck buffer %d must be >= 0", b.Buffer)
	case b.Kmin < 0 || b.Kmax < b.Kmin:
		return fmt.Errorf("memnet: bottleneck thresholds Kmin %d, Kmax %d: need 0 <= Kmin <= Kmax", b.Kmin, b.Kmax)
	case !(b.Pmax >= 0 && b.Pmax <= 1):
		return fmt.Errorf("memnet: bottleneck Pmax %v must be in [0, 1]", b.Pmax)
	}
	return nil
}

// MarkProbability returns the probability that an ECN-capable packet
// arriving at a queue holding depth bytes is marked CE.
func (b Bottleneck) MarkProbability(depth int) float64 {
	switch {
	case b.Kmax == 0 || depth <= b.Kmin:
		return 0
	case depth > b.Kmax:
		return 1
	case b.Kmax == b.Kmin:
		return b.Pmax
	}
	return b.Pmax * float64(depth-b.Kmin) / float64(b.Kmax-b.Kmin)
}

// PortStats are the counters of a SwitchPort. Byte counts are IP datagram
// bytes (see Bottleneck).
type PortStats struct {
	Enqueued      uint64 // packets accepted into the queue
	EnqueuedBytes uint64
	Marked        uint64 // packets queued that were marked CE on arrival
	Dropped       uint64 // packets tail-dropped (queue full)
	DroppedBytes  uint64
	Departed      uint64 // packets that finished draining and went on
	DepartedBytes uint64
	Depth         int // bytes queued now
	MaxDepth      int // largest depth ever seen
	// DepthArea is the integral of the depth over time since the port was
	// made, in byte·seconds: the mean depth between two snapshots a and b
	// is MeanDepth(a, b).
	DepthArea float64
	// At is the network time of the snapshot, Since the port's creation.
	At, Since time.Time
}

// MeanDepth returns the time-averaged queue depth in bytes between two
// snapshots of one port, a taken before b; 0 if no time passed.
func MeanDepth(a, b PortStats) float64 {
	dt := b.At.Sub(a.At).Seconds()
	if dt <= 0 {
		return 0
	}
	return (b.DepthArea - a.DepthArea) / dt
}

// Mean returns the time-averaged queue depth in bytes since the port was made.
func (s PortStats) Mean() float64 { return MeanDepth(PortStats{At: s.Since}, s) }

// SwitchPort is a rate-limited queue inside a MemNetwork, made by
// MemNetwork.Bottleneck or MemLink.Shape. Its methods are safe for
// concurrent use.
//
// In a real-time network (NewMemNetwork) departures are driven by a timer
// at the head packet's departure time: the queue's accounting is exact,
// the delivery may come a little late (timer slack). In a virtual-time
// network (NewVirtualMemNetwork) departures happen inside
// MemNetwork.Step, exactly at their times.
type SwitchPort struct {
	n     *MemNetwork
	cfg   Bottleneck
	tx    *MemLink // the link whose transmit line this is (Shape), or nil
	order int      // creation order, breaks ties between ports

	// guarded by n.mu
	q        []*memBuf // FIFO; q[qh:] are queued
	qh       int
	busyTill time.Time // when the last queued packet has finished draining
	carry    float64   // sub-nanosecond remainder of the drain times
	st       PortStats
	timer    *time.Timer // real-time mode: fires at the head's departure
	timerAt  time.Time
}

// Config returns the port's configuration.
func (p *SwitchPort) Config() Bottleneck { return p.cfg }

// Stats returns a snapshot of the port's counters, its depth integral
// brought up to the network's current time.
func (p *SwitchPort) Stats() PortStats {
	n := p.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.vnow == nil {
		p.departDue(time.Now())
	}
	p.integrate(n.now())
	return p.st
}

// Depth returns the bytes queued now.
func (p *SwitchPort) Depth() int {
	n := p.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.vnow == nil {
		p.departDue(time.Now())
	}
	return p.st.Depth
}

// ipLen is the IP datagram length of b.
func ipLen(b *memBuf) int {
	if b.src.Is4() {
		return b.n + 8 + 20
	}
	return b.n + 8 + 40
}

// integrate adds the depth's area up to t. Called with n.mu held.
func (p *SwitchPort) integrate(t time.Time) {
	if dt := t.Sub(p.st.At); dt > 0 {
		p.st.DepthArea += float64(p.st.Depth) * dt.Seconds()
		p.st.At = t
	}
}

// head returns the next packet to depart, or nil. Called with n.mu held.
func (p *SwitchPort) head() *memBuf {
	if p.qh == len(p.q) {
		return nil
	}
	return p.q[p.qh]
}

// enqueue offers b to the port at time now: it is marked (one random draw
// per packet when marking is on), dropped if it does not fit, or queued
// with its departure time. It reports whether b was queued; a dropped b is
// released. Called with n.mu held.
func (p *SwitchPort) enqueue(now time.Time, b *memBuf) bool {
	n := p.n
	p.integrate(now)
	size := ipLen(b)
	r := 1.0
	if p.cfg.Kmax > 0 {
		r = n.rng.Float64() // drawn for every packet, kept or not: a fixed pattern
	}
	if p.cfg.Buffer > 0 && p.st.Depth+size > p.cfg.Buffer {
		p.st.Dropped++
		p.st.DroppedBytes += uint64(size)
		putMemBuf(b)
		return false
	}
	if r < p.cfg.MarkProbability(p.st.Depth) && b.tos&udp.ECNMask != udp.ECNNotECT && b.tos&udp.ECNMask != udp.ECNCE {
		b.tos |= udp.ECNCE
		p.st.Marked++
	}
	start := p.busyTill
	if start.Before(now) {
		start = now
	}
	ns := float64(size)*8e9/p.cfg.Rate + p.carry
	whole := math.Floor(ns)
	p.carry = ns - whole
	p.busyTill = start.Add(time.Duration(whole))
	b.at = p.busyTill
	if p.qh > 0 && p.qh == len(p.q) {
		p.q = p.q[:0]
		p.qh = 0
	}
	p.q = append(p.q, b)
	p.st.Enqueued++
	p.st.EnqueuedBytes += uint64(size)
	p.st.Depth += size
	p.st.MaxDepth = max(p.st.MaxDepth, p.st.Depth)
	if n.vnow == nil {
		p.armTimer()
	}
	return true
}

// depart removes the head packet at its departure time and passes it on:
// a transmit line's packet enters the network (faults, then the switch
// port toward its destination), a switch port's packet goes to its
// destination link. Called with n.mu held.
func (p *SwitchPort) depart() {
	b := p.q[p.qh]
	p.q[p.qh] = nil
	p.qh++
	t := b.at
	p.integrate(t)
	size := ipLen(b)
	p.st.Depth -= size
	p.st.Departed++
	p.st.DepartedBytes += uint64(size)
	if p.qh > 64 && p.qh*2 > len(p.q) {
		m := copy(p.q, p.q[p.qh:])
		clear(p.q[m:])
		p.q = p.q[:m]
		p.qh = 0
	}
	n := p.n
	if p.tx != nil {
		n.enter(p.tx, b, t)
		return
	}
	dst := b.dst
	b.dst = nil
	n.propagate(dst, b, t)
}

// departDue lets every packet due by now depart. Called with n.mu held.
func (p *SwitchPort) departDue(now time.Time) {
	for h := p.head(); h != nil && !h.at.After(now); h = p.head() {
		p.depart()
	}
}

// armTimer (real-time mode) sets the port's timer for the head packet's
// departure unless it is already set for it. Called with n.mu held.
func (p *SwitchPort) armTimer() {
	h := p.head()
	if h == nil || (p.timer != nil && p.timerAt.Equal(h.at)) {
		return
	}
	p.timerAt = h.at
	d := time.Until(h.at)
	if p.timer == nil {
		p.timer = time.AfterFunc(d, p.onTimer)
		return
	}
	p.timer.Reset(d)
}

// onTimer is the real-time departure timer.
func (p *SwitchPort) onTimer() {
	n := p.n
	n.mu.Lock()
	defer n.mu.Unlock()
	p.timerAt = time.Time{}
	p.departDue(time.Now())
	p.armTimer()
}

// stop drops what the port holds (the network is being torn down or the
// link closed). Called with n.mu held.
func (p *SwitchPort) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
	for i := p.qh; i < len(p.q); i++ {
		putMemBuf(p.q[i])
		p.q[i] = nil
	}
	p.q, p.qh = p.q[:0], 0
	p.st.Depth = 0
}

// Bottleneck puts a switch egress port with configuration b in front of
// address to: every packet sent to to (after the Faults, which model the
// wire before the switch) queues there, is marked, dropped or delayed as
// b says, and then goes on to to's link (after Faults.Delay in a
// virtual-time network). The address need not have a link yet. A second
// call for the same address fails.
func (n *MemNetwork) Bottleneck(to netip.Addr, b Bottleneck) (*SwitchPort, error) {
	a := udp.NormAddr(to)
	if !a.IsValid() || a.IsUnspecified() {
		return nil, fmt.Errorf("memnet: bottleneck address %v: %w", to, udp.ErrAddress)
	}
	if err := b.check(); err != nil {
		return nil, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ports[a] != nil {
		return nil, fmt.Errorf("memnet: bottleneck toward %s already set", a)
	}
	p := n.newPort(b)
	if n.ports == nil {
		n.ports = make(map[netip.Addr]*SwitchPort)
	}
	n.ports[a] = p
	return p, nil
}

// Shape gives the link a transmit line: every packet it sends queues in a
// SwitchPort with configuration b (typically just a Rate: a NIC's line
// rate, unlimited buffer, no marking) before it enters the network. A
// second call fails.
func (l *MemLink) Shape(b Bottleneck) (*SwitchPort, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	n := l.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if l.txPort != nil {
		return nil, fmt.Errorf("memnet: link %s already shaped", l.addr)
	}
	p := n.newPort(b)
	p.tx = l
	l.txPort = p
	return p, nil
}

// newPort makes a port. Called with n.mu held.
func (n *MemNetwork) newPort(b Bottleneck) *SwitchPort {
	now := n.now()
	p := &SwitchPort{n: n, cfg: b, order: len(n.portList), busyTill: now}
	p.st.At, p.st.Since = now, now
	n.portList = append(n.portList, p)
	return p
}
