package memnet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorocev2/rocev2/icrc"
	"github.com/gorocev2/rocev2/udp"
)

// Faults configures the impairments of a MemNetwork. Probabilities are per
// packet, in [0, 1] (values outside are clamped, NaN counts as 0).
//
// A packet passes the stages in this order: loss, ECN marking, corruption,
// duplication, reordering, delay. The random decisions come from one PCG stream seeded
// with Seed, drawn in a fixed pattern per packet, so a run that sends the
// same packets in the same order sees exactly the same faults.
type Faults struct {
	// Loss is the probability that a packet disappears.
	Loss float64
	// Dup is the probability that a packet is delivered twice.
	Dup float64
	// Reorder is the probability that a packet is held back and delivered
	// after the next packet to the same destination (or after ReorderHold
	// when no further packet comes). Not available in virtual time.
	Reorder float64
	// Corrupt is the probability that one random bit of the packet is
	// flipped. Only bits the ICRC covers are chosen (not the masked BTH
	// byte 4), so the receiving MemLink always detects the damage, drops the
	// packet and counts it in Stats.DropBadICRC.
	Corrupt float64
	// Delay is added to every packet's delivery; delivery is timer driven and
	// never blocks the sender. Packets leave the delay line in FIFO order.
	// In virtual time (NewVirtualMemNetwork) it is the propagation delay
	// of every delivery, after any switch port.
	Delay time.Duration
	// CEMark is the probability that an ECN-capable packet (TOS ECN bits
	// ECT(0) or ECT(1)) arrives marked Congestion Experienced, as a switch
	// with ECN marking would do; it drives the CNP path.
	CEMark float64
	// Seed seeds the fault generator.
	Seed int64
	// ReorderHold bounds how long a reordered packet waits for a successor;
	// 0 means 1 ms.
	ReorderHold time.Duration
}

// MemCounters counts what a MemNetwork did to the packets it carried.
type MemCounters struct {
	Packets    uint64 // packets offered to the network by Send
	Lost       uint64 // dropped by the Loss fault
	Duplicated uint64 // extra copies made by the Dup fault
	Reordered  uint64 // packets held back by the Reorder fault
	Corrupted  uint64 // packets with one bit flipped by the Corrupt fault
	CEMarked   uint64 // ECN-capable packets marked CE by the CEMark fault
	Delayed    uint64 // packets that went through the delay line
	NoRoute    uint64 // packets sent to an address with no link (silently dropped)
}

const (
	memQueueLen       = 4096    // per-link delivery queue, like a NIC ring
	memDelayMax       = 1 << 16 // packets on the delay line; more are dropped (DropOther at the destination)
	memBatchSize      = 128
	defaultReorderHld = time.Millisecond
)

// memBuf is one packet in flight inside a MemNetwork. Buffers are pooled.
type memBuf struct {
	n       int
	src     netip.Addr
	srcPort uint16
	tos     uint8
	at      time.Time  // delivery time on the delay line, departure time in a SwitchPort, send time while staged
	dst     *MemLink   // destination while on the delay line or in a switch port
	dstAddr netip.Addr // destination address while in a transmit line or staged
	link    *MemLink   // sending link while in a transmit line or staged
	b       [udp.MaxPacketSize]byte
}

var memBufPool = sync.Pool{New: func() any { return new(memBuf) }}

func getMemBuf() *memBuf { return memBufPool.Get().(*memBuf) }

func putMemBuf(b *memBuf) {
	b.dst = nil
	b.link = nil
	b.src = netip.Addr{}
	b.dstAddr = netip.Addr{}
	memBufPool.Put(b)
}

// MemNetwork is an in-memory IP network of MemLinks with seeded, reproducible
// faults, in the style of wireguard-go's conn/bindtest. It is safe for
// concurrent use.
type MemNetwork struct {
	mu     sync.Mutex
	links  map[netip.Addr]*MemLink
	faults Faults
	src    *rand.PCG
	rng    *rand.Rand
	ctr    MemCounters

	// delay line: a FIFO ring of packets waiting for their delivery time,
	// drained by one goroutine that runs while the ring is not empty.
	delayQ       []*memBuf
	delayHead    int
	delayLen     int
	delayRunning bool
	delayTimer   *time.Timer

	tap TapFunc

	// switch ports (memswitch.go)
	ports    map[netip.Addr]*SwitchPort // egress ports by destination
	portList []*SwitchPort              // every port, in creation order

	// virtual-time mode (memvirtual.go); vnow is nil in real time.
	vnow     func() time.Time
	linkList []*MemLink // links in creation order
	vin      []*memBuf  // staged packets not yet entered, sorted by send time
	vlast    time.Time  // time of the last event processed
	vdelay   []*memBuf  // propagation delay line (FIFO), vdelay[vdh:] pending
	vdh      int
	vbusy    int           // links with packets delivered and their receiver not back in Recv
	vquiet   chan struct{} // poked when vbusy drops to 0
}

// TapFunc sees a packet entering a MemNetwork: the IP addresses, UDP source
// port (destination is 4791), TOS and the UDP payload (BTH .. ICRC) exactly
// as sent, before any fault. It runs with the network locked: it must not
// block or call into the network, and payload is only valid during the call.
type TapFunc func(src, dst netip.Addr, srcPort uint16, tos uint8, payload []byte)

// SetTap installs fn (nil removes it) to observe every packet sent on the
// network, e.g. to write a pcap for Wireshark.
func (n *MemNetwork) SetTap(fn TapFunc) {
	n.mu.Lock()
	n.tap = fn
	n.mu.Unlock()
}

// NewMemNetwork returns an empty network with the given faults.
func NewMemNetwork(f Faults) *MemNetwork {
	n := &MemNetwork{links: make(map[netip.Addr]*MemLink)}
	n.faults = n.sanitizeFaults(f)
	n.src = rand.NewPCG(uint64(f.Seed), 0x9e3779b97f4a7c15)
	n.rng = rand.New(n.src)
	return n
}

func clampProb(p float64) float64 {
	switch {
	case math.IsNaN(p) || p < 0:
		return 0
	case p > 1:
		return 1
	}
	return p
}

func (n *MemNetwork) sanitizeFaults(f Faults) Faults {
	f.Loss = clampProb(f.Loss)
	f.Dup = clampProb(f.Dup)
	f.Reorder = clampProb(f.Reorder)
	f.Corrupt = clampProb(f.Corrupt)
	f.CEMark = clampProb(f.CEMark)
	if f.Delay < 0 {
		f.Delay = 0
	}
	if f.ReorderHold <= 0 {
		f.ReorderHold = defaultReorderHld
	}
	if n.vnow != nil {
		f.Reorder = 0 // wall-clock driven: not available in virtual time
	}
	return f
}

// SetFaults changes the faults at run time; they apply to packets sent after
// it returns. The random stream continues, unless f.Seed differs from the
// current seed: then it restarts from f.Seed. Lowering Delay does not
// overtake packets already on the delay line.
func (n *MemNetwork) SetFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f.Seed != n.faults.Seed {
		n.src.Seed(uint64(f.Seed), 0x9e3779b97f4a7c15)
	}
	n.faults = n.sanitizeFaults(f)
}

// Faults returns the current faults.
func (n *MemNetwork) Faults() Faults {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.faults
}

// Counters returns a snapshot of what the network did to its packets.
func (n *MemNetwork) Counters() MemCounters {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.ctr
}

// Link attaches a new link with the given IP address. IPv4-mapped IPv6
// addresses (the RoCEv2 GID form) are treated as IPv4. It fails with an error
// matching syscall.EADDRINUSE when the address already has a link.
func (n *MemNetwork) Link(addr netip.Addr) (*MemLink, error) {
	a := udp.NormAddr(addr)
	if !a.IsValid() || a.IsUnspecified() {
		return nil, fmt.Errorf("memnet: link address %v: %w", addr, udp.ErrAddress)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.links[a]; ok {
		return nil, fmt.Errorf("memnet: link %s port %d: %w", a, udp.Port, syscall.EADDRINUSE)
	}
	l := &MemLink{
		net:  n,
		addr: a,
		q:    make(chan *memBuf, memQueueLen),
		done: make(chan struct{}),
	}
	if n.vnow != nil {
		l.vwake = make(chan struct{}, 1)
	}
	n.links[a] = l
	n.linkList = append(n.linkList, l)
	return l, nil
}

// MemLink is one attachment to a MemNetwork. It implements Link, with
// Link's goroutine-safety contract.
type MemLink struct {
	net  *MemNetwork
	addr netip.Addr
	q    chan *memBuf
	done chan struct{}

	// guarded by net.mu
	closed     bool
	held       *memBuf // packet held back by the Reorder fault
	heldUntil  time.Time
	heldTimer  *time.Timer
	heldTimerF func()
	txPort     *SwitchPort // transmit line (Shape), or nil

	// virtual-time mode (memvirtual.go), guarded by net.mu
	staged []*memBuf // sent, not yet entered the network
	vq     []*memBuf // delivered, vq[vqh:] not yet received
	vqh    int
	vbusy  bool          // counted in net.vbusy
	vwake  chan struct{} // poked when vq grows
	vtake  []*memBuf     // Recv's scratch (one Recv caller)

	counters
}

var _ udp.BacklogLink = (*MemLink)(nil)

// RecvBacklog reports whether delivered packets wait in the link's
// receive queue, not yet taken by Recv (udp.BacklogLink).
func (l *MemLink) RecvBacklog() bool {
	if len(l.q) > 0 {
		return true
	}
	if l.vwake == nil {
		return false
	}
	l.net.mu.Lock()
	defer l.net.mu.Unlock()
	return l.vqh < len(l.vq)
}

// LocalAddr returns the link's address.
func (l *MemLink) LocalAddr() netip.Addr { return l.addr }

// Simulated reports true: the link is an in-memory network's, whose
// peers live in this process (transport.Device.Simulated).
func (l *MemLink) Simulated() bool { return true }

// BatchSize returns the preferred number of packets per Send/Recv call.
func (l *MemLink) BatchSize() int { return memBatchSize }

// Stats returns a snapshot of the link's counters.
func (l *MemLink) Stats() udp.Stats { return l.stats() }

func (l *MemLink) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Send fills each packet's ICRC (IPv4: source = this link, ID 0, DF; UDP
// source port Packet.SrcPort, destination port 4791; IPv6 likewise) and hands
// the packets to the network, which copies them. Packets to an address with no
// link are silently dropped and counted in MemNetwork.Counters().NoRoute.
func (l *MemLink) Send(pkts []udp.Packet) error {
	if l.isClosed() {
		return net.ErrClosed
	}
	if err := udp.CheckSend(pkts, l.addr); err != nil {
		return err
	}
	for i := range pkts {
		p := &pkts[i]
		icrc.Store(p.Buf, udp.ComputeICRC(l.addr, udp.NormAddr(p.Addr), p.SrcPort, 0, p.Buf))
	}
	l.transmit(pkts)
	return nil
}

// SendRaw hands datagrams to the network exactly as given: no ICRC is
// filled and any length up to MaxPacketSize is accepted. It exists to test
// receivers with garbage, truncated or mis-checksummed datagrams.
func (l *MemLink) SendRaw(pkts []udp.Packet) error {
	if l.isClosed() {
		return net.ErrClosed
	}
	for i := range pkts {
		p := &pkts[i]
		dst := udp.NormAddr(p.Addr)
		if len(p.Buf) > udp.MaxPacketSize {
			return fmt.Errorf("memnet: send packet %d: length %d > %d: %w", i, len(p.Buf), udp.MaxPacketSize, udp.ErrPacketSize)
		}
		if !dst.IsValid() || dst.Is4() != l.addr.Is4() {
			return fmt.Errorf("memnet: send packet %d: destination %v from %v: %w", i, p.Addr, l.addr, udp.ErrAddress)
		}
	}
	l.transmit(pkts)
	return nil
}

// transmit hands pkts to the network and counts them as sent.
func (l *MemLink) transmit(pkts []udp.Packet) {
	n := l.net
	n.mu.Lock()
	switch {
	case n.vnow != nil:
		n.stage(l, pkts)
	case l.txPort != nil:
		now := time.Now()
		l.txPort.departDue(now)
		for i := range pkts {
			l.txPort.enqueue(now, l.copyOut(&pkts[i]))
		}
	default:
		var now time.Time // only switch ports need the time
		if len(n.portList) > 0 {
			now = time.Now()
		}
		for i := range pkts {
			n.route(l, &pkts[i], now)
		}
	}
	n.mu.Unlock()
	l.sent.Add(uint64(len(pkts)))
}

// copyOut copies a packet l sends into a pooled buffer that remembers its
// destination and sender, for a transmit line or the virtual-time stage.
func (l *MemLink) copyOut(p *udp.Packet) *memBuf {
	b := getMemBuf()
	b.n = copy(b.b[:], p.Buf)
	b.src = l.addr
	b.srcPort = p.SrcPort
	b.tos = p.TOS
	b.dstAddr = udp.NormAddr(p.Addr)
	b.link = l
	return b
}

// enter routes a packet that src sent earlier (from its transmit line or
// the virtual-time stage) into the network at time t, and releases b.
// Called with n.mu held.
func (n *MemNetwork) enter(src *MemLink, b *memBuf, t time.Time) {
	p := udp.Packet{Buf: b.b[:b.n], Addr: b.dstAddr, SrcPort: b.srcPort, TOS: b.tos}
	n.route(src, &p, t)
	putMemBuf(b)
}

// toDst passes b, which has been through the faults, on toward dst at
// time now: through dst's switch port if it has one, else straight on.
// Called with n.mu held.
func (n *MemNetwork) toDst(dst *MemLink, b *memBuf, now time.Time) {
	if p := n.ports[dst.addr]; p != nil { // a nil map when there are none
		if now.IsZero() {
			now = time.Now()
		}
		b.dst = dst
		if n.vnow == nil {
			p.departDue(now)
		}
		p.enqueue(now, b)
		return
	}
	n.propagate(dst, b, now)
}

// propagate hands b to dst after the network's delay: the wall-clock delay
// line in real time, the virtual one in virtual time. Called with n.mu held.
func (n *MemNetwork) propagate(dst *MemLink, b *memBuf, t time.Time) {
	if n.vnow != nil {
		n.vforward(dst, b, t)
		return
	}
	n.forward(dst, b)
}

// route applies the faults to one packet sent at time now and forwards it.
// Called with n.mu held.
func (n *MemNetwork) route(src *MemLink, p *udp.Packet, now time.Time) {
	f := &n.faults
	n.ctr.Packets++
	if n.tap != nil {
		n.tap(src.addr, udp.NormAddr(p.Addr), p.SrcPort, p.TOS, p.Buf)
	}
	// Fixed draw pattern per packet keeps runs reproducible.
	rLoss, rCorrupt, rDup, rReorder := n.rng.Float64(), n.rng.Float64(), n.rng.Float64(), n.rng.Float64()
	dst := n.links[udp.NormAddr(p.Addr)]
	if dst == nil || dst.closed {
		n.ctr.NoRoute++
		return
	}
	if rLoss < f.Loss {
		n.ctr.Lost++
		return
	}
	b := getMemBuf()
	b.n = copy(b.b[:], p.Buf)
	b.src = src.addr
	b.srcPort = p.SrcPort
	b.tos = p.TOS
	// Drawn only when CEMark is set, so configurations without it keep
	// their random sequences.
	if f.CEMark > 0 && n.rng.Float64() < f.CEMark && b.tos&udp.ECNMask != udp.ECNNotECT && b.tos&udp.ECNMask != udp.ECNCE {
		b.tos |= udp.ECNCE
		n.ctr.CEMarked++
	}
	if rCorrupt < f.Corrupt && b.n > 4 {
		// Flip one bit among those the ICRC covers: every byte except the
		// masked BTH byte 4 (FECN/BECN), including the ICRC trailer.
		bit := n.rng.IntN((b.n - 1) * 8)
		i := bit / 8
		if i >= 4 {
			i++
		}
		b.b[i] ^= 1 << (bit % 8)
		n.ctr.Corrupted++
	}
	var dup *memBuf
	if rDup < f.Dup {
		dup = getMemBuf()
		dup.n = copy(dup.b[:], b.b[:b.n])
		dup.src, dup.srcPort, dup.tos = b.src, b.srcPort, b.tos
		n.ctr.Duplicated++
	}
	if rReorder < f.Reorder && dst.held == nil {
		n.ctr.Reordered++
		n.hold(dst, b)
		b = nil
	}
	if b != nil {
		n.toDst(dst, b, now)
	}
	if dup != nil {
		n.toDst(dst, dup, now)
	}
	if b != nil && dst.held != nil {
		h := dst.held
		dst.held = nil
		dst.heldTimer.Stop()
		n.toDst(dst, h, now)
	}
}

// hold parks b on dst until the next packet to dst or until ReorderHold
// passes. Called with n.mu held.
func (n *MemNetwork) hold(dst *MemLink, b *memBuf) {
	dst.held = b
	dst.heldUntil = time.Now().Add(n.faults.ReorderHold)
	if dst.heldTimer == nil {
		dst.heldTimerF = func() { n.releaseHeld(dst) }
		dst.heldTimer = time.AfterFunc(n.faults.ReorderHold, dst.heldTimerF)
		return
	}
	dst.heldTimer.Reset(n.faults.ReorderHold)
}

// releaseHeld is the ReorderHold timer: it forwards the held packet unless it
// was already released (a stale timer finds none, or a newer one not yet due).
func (n *MemNetwork) releaseHeld(dst *MemLink) {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := dst.held
	if h == nil || time.Now().Before(dst.heldUntil) {
		return
	}
	dst.held = nil
	n.toDst(dst, h, time.Now())
}

// forward sends b to dst through the delay line when Delay is set, else
// directly. Called with n.mu held.
func (n *MemNetwork) forward(dst *MemLink, b *memBuf) {
	if n.faults.Delay <= 0 && n.delayLen == 0 {
		n.deliver(dst, b)
		return
	}
	if n.delayLen >= memDelayMax {
		dst.other.Add(1) // like a bufferbloated router finally dropping
		putMemBuf(b)
		return
	}
	n.ctr.Delayed++
	b.at = time.Now().Add(n.faults.Delay)
	b.dst = dst
	if n.delayLen == len(n.delayQ) {
		n.growDelay()
	}
	n.delayQ[(n.delayHead+n.delayLen)%len(n.delayQ)] = b
	n.delayLen++
	if !n.delayRunning {
		n.delayRunning = true
		if n.delayTimer == nil {
			n.delayTimer = time.NewTimer(time.Hour)
			n.delayTimer.Stop()
		}
		go n.delayLoop()
	}
}

func (n *MemNetwork) growDelay() {
	nq := make([]*memBuf, max(64, 2*len(n.delayQ)))
	for i := 0; i < n.delayLen; i++ {
		nq[i] = n.delayQ[(n.delayHead+i)%len(n.delayQ)]
	}
	n.delayQ = nq
	n.delayHead = 0
}

// delayLoop delivers packets from the delay line when they are due. It exits
// when the line is empty; forward starts it again.
func (n *MemNetwork) delayLoop() {
	n.mu.Lock()
	for n.delayLen > 0 {
		b := n.delayQ[n.delayHead]
		d := time.Until(b.at)
		if d > 0 {
			n.mu.Unlock()
			n.delayTimer.Reset(d)
			<-n.delayTimer.C
			n.mu.Lock()
			continue
		}
		n.delayQ[n.delayHead] = nil
		n.delayHead = (n.delayHead + 1) % len(n.delayQ)
		n.delayLen--
		dst := b.dst
		b.dst = nil
		n.deliver(dst, b)
	}
	n.delayRunning = false
	n.mu.Unlock()
}

// deliver puts b on dst's receive queue, dropping it when the link is closed
// or the queue is full (counted as DropOther, like a NIC ring overflow).
// Called with n.mu held.
func (n *MemNetwork) deliver(dst *MemLink, b *memBuf) {
	if dst.closed {
		putMemBuf(b)
		return
	}
	select {
	case dst.q <- b:
	default:
		dst.other.Add(1)
		putMemBuf(b)
	}
}

// Recv blocks until at least one valid packet is available, then returns up
// to len(pkts) of them. Each datagram's ICRC is verified for the IP/UDP
// header it travelled with (sender address and source port, this link's
// address, port 4791, IPv4 ID 0 with DF); bad ones count as DropBadICRC,
// datagrams shorter than BTH+ICRC as DropMalformed. Addr is the sender's
// address. After Close it returns net.ErrClosed.
func (l *MemLink) Recv(pkts []udp.Packet) (int, error) {
	if err := udp.CheckRecv(pkts, len(pkts)); err != nil || len(pkts) == 0 {
		return 0, err
	}
	if l.vwake != nil {
		return l.recvVirtual(pkts)
	}
	for {
		if l.isClosed() {
			return 0, net.ErrClosed
		}
		var b *memBuf
		select {
		case b = <-l.q:
		case <-l.done:
			return 0, net.ErrClosed
		}
		n := 0
		for {
			if l.accept(b, &pkts[n]) {
				n++
			}
			putMemBuf(b)
			if n == len(pkts) {
				break
			}
			select {
			case b = <-l.q:
				continue
			default:
			}
			break
		}
		if n > 0 {
			l.rcvd.Add(uint64(n))
			return n, nil
		}
	}
}

// RecvPrefix reports true: Recv fills only the slots it returns, in the
// buffers given, and a datagram it drops leaves its slot as it was
// (udp.PrefixRecvLink).
func (l *MemLink) RecvPrefix() bool { return true }

// accept verifies b and copies it into p. It reports whether p was filled.
func (l *MemLink) accept(b *memBuf, p *udp.Packet) bool {
	if b.n < udp.MinPacketSize {
		l.malformed.Add(1)
		return false
	}
	data := b.b[:b.n]
	if udp.ComputeICRC(b.src, l.addr, b.srcPort, 0, data) != icrc.Load(data) {
		l.badICRC.Add(1)
		return false
	}
	p.Buf = p.Buf[:b.n]
	copy(p.Buf, data)
	p.Addr = b.src
	p.SrcPort = b.srcPort
	p.TOS = b.tos
	return true
}

// Close detaches the link from the network (its address becomes free),
// discards queued packets and makes a blocked Recv return net.ErrClosed.
// Closing twice is harmless.
func (l *MemLink) Close() error {
	n := l.net
	n.mu.Lock()
	if l.closed {
		n.mu.Unlock()
		return nil
	}
	l.closed = true
	if n.links[l.addr] == l {
		delete(n.links, l.addr)
	}
	if l.held != nil {
		putMemBuf(l.held)
		l.held = nil
	}
	if l.heldTimer != nil {
		l.heldTimer.Stop()
	}
	l.closeVirtual()
	close(l.done)
	n.mu.Unlock()
	for {
		select {
		case b := <-l.q:
			putMemBuf(b)
		default:
			return nil
		}
	}
}

// counters are a MemLink's Stats, updated atomically.
type counters struct {
	sent, rcvd, badICRC, malformed, other atomic.Uint64
}

// stats returns a snapshot of c (DropKernel is always 0: there is no kernel).
func (c *counters) stats() udp.Stats {
	return udp.Stats{
		SentPkts:      c.sent.Load(),
		RcvdPkts:      c.rcvd.Load(),
		DropBadICRC:   c.badICRC.Load(),
		DropMalformed: c.malformed.Load(),
		DropOther:     c.other.Load(),
	}
}
