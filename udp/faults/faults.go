//go:build linux

// Package faults is a fault injector for real network paths: a tc eBPF
// program, built in Go with cilium/ebpf's asm package (no clang), that
// drops, duplicates, reorders and ECN-marks RoCEv2 packets (UDP destination
// port 4791, IPv4 or IPv6) on an interface, with rates changeable at run
// time and per-action counters. It also models a switch queue (Congestion):
// a phantom queue drained at a set rate that marks CE on its depth and
// drops at its limit, the bottleneck congestion control is tested on.
//
// The host kernel has no netem; the program replaces it for RoCE traffic.
// It attaches with TCX (kernel >= 6.6) or, when TCX is not available, as a
// cls_bpf direct-action filter under a clsact qdisc installed with iproute2's
// tc. See Config for the actions and Counters for what is counted.
//
// # UDP GSO datagrams
//
// A UDP GSO sender (rocev2's SocketLink on lo and veth by default) hands
// the kernel one skb for up to 64 RoCE packets; tc sees that skb whole,
// and the packets become separate datagrams only later (software
// segmentation, the receiving socket, or a NIC). The program treats every
// segment as a packet of its own, as it would be on the wire:
//
//   - it reads each segment's BTH (segment k's UDP payload starts at
//     k·gso_size) and counts the segments: Counters.Seen equals the packets
//     the senders sent, GSO or not; GSO and GSOSegs say how much of it came
//     as GSO datagrams;
//   - the DestQP filter, the PSN range and the every-Nth sequence select
//     segments by their own BTH (the sequence advances per segment), and the
//     random rates (DropRate, CERate, DupRate) are drawn per segment, so a
//     datagram of n segments is hit with probability 1−(1−rate)^n;
//   - one skb can only be dropped, marked or cloned whole: what one segment
//     draws applies to its whole datagram, and the counters count all its
//     segments (a drop of an 8-segment datagram adds 8 to DropRandom and to
//     Dropped; GSODropped and GSOMarked count datagrams). A CE mark on the
//     datagram's IP header reaches every segment: the kernel copies the
//     header into each (checked on the wire by TestGSOCaptureSegments);
//   - PSNRange.Limit counts the in-range segments of the datagrams it
//     dropped;
//   - the congestion point takes the segments back to back: the datagram is
//     tail-dropped whole when its last segment would pass the limit, and
//     segment k draws its mark on the depth plus k segments;
//   - datagrams are never held for reordering (too large for the slot); a
//     held packet leaves behind the next packet or GSO datagram (cloned
//     out first, as a single packet is);
//   - a datagram with more than 128 segments (Linux's UDP_MAX_SEGMENTS), or
//     whose lengths are not UDP GSO's layout, passes whole, counted in
//     GSOSkipped.
//
// So with GSO the share of packets hit is higher than the rate: 3 % CE on
// 32-segment datagrams marks 1−0.97^32 = 62 % of the datagrams and of the
// packets. For per-packet rates as configured, send without GSO.
//
// The program reads __sk_buff.gso_segs (Linux >= 5.1) and gso_size (Linux
// >= 5.7); on an older kernel Load fails with an error naming the field.
//
// Reordering holds one frame per hook in a BPF map (it is dropped there)
// and releases it behind the next RoCE packet through the same hook: that
// packet is cloned out first (bpf_clone_redirect to the same interface and
// direction) and its skb is then rewritten into the held frame
// (bpf_skb_change_tail + bpf_skb_store_bytes). The held packet thus arrives
// one packet late. A held frame waits for the next packet; with no more
// traffic it never leaves (the sender's retransmission recovers, and the
// late original is a duplicate when it finally goes).
//
// A drop on the egress hook is silent to the sender, as a loss in the
// network is: the packet is marked and redirected to the same egress (the
// send succeeds) and dropped on that second pass. A plain TC_ACT_SHOT would
// come back to a UDP socket with IP_RECVERR as ENOBUFS, and the sender
// would send the packet again.
//
// Duplication clones the packet to the same interface and direction: the
// copy leaves just before the original. Clones carry skb->mark 0x72636576
// while they pass the hook again so the program lets them through.
//
// # Place in the module
//
// It serves `rocev2d faults` (cmd/rocev2d) and the tests that run the
// transport over a lossy kernel path (test/veth, test/interop). It works on
// the kernel's packets, not on a udp.Link, and imports nothing of this
// module but internal/netns (to attach inside a named network namespace):
// cilium/ebpf, golang.org/x/sys and the standard library. Linux only.
package faults

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Hook is a tc attach point of an interface.
type Hook int

const (
	// Egress is the interface's transmit path (packets leaving it).
	Egress Hook = iota
	// Ingress is the interface's receive path (packets arriving on it).
	Ingress
	numHooks
)

// String returns "egress" or "ingress".
func (h Hook) String() string {
	switch h {
	case Egress:
		return "egress"
	case Ingress:
		return "ingress"
	}
	return fmt.Sprintf("Hook(%d)", int(h))
}

// PSNRange selects packets by their BTH PSN: First through Last inclusive,
// modulo 2^24 (a range may wrap).
type PSNRange struct {
	First, Last uint32
	// Limit stops PSN-range drops after this many per hook (0 = no limit),
	// so a retransmission of the same PSNs gets through. Without a limit a
	// range that covers requests is a black hole: the sender exhausts its
	// retries. A GSO datagram dropped by the range spends one per segment
	// of it in the range.
	Limit uint32
}

// Config selects the faults. The zero value passes everything. Rates are
// probabilities in [0, 1] applied independently per packet (drawn with
// bpf_get_prandom_u32 against a 32-bit threshold; 1 means all but a 2^-32
// fraction); a UDP GSO datagram's segments draw one each, and a draw hits
// the whole datagram (see the package doc). A packet is tested in this order: DestQP filter, PSN range,
// every Nth, random drop, congestion point, release of a held packet,
// reorder, CE mark, duplicate; a dropped packet is not also held, marked or
// duplicated.
type Config struct {
	// DropRate drops packets at random.
	DropRate float64
	// DropEveryN drops every Nth RoCE packet (the Nth, 2Nth, ... seen by a
	// hook since attach or ResetCounters; a GSO datagram's segments count
	// one each, and the datagram holding the Nth is dropped). 0 disables. Beware: when a
	// go-back-N retransmission flight is exactly N packets (or a multiple)
	// long, the same packet is lost in every retry and the sender runs out
	// of retries; choose N above the sender's window (rxe and rocev2: 128).
	DropEveryN uint32
	// DropPSN drops packets whose PSN is in the range. nil disables.
	DropPSN *PSNRange
	// DupRate duplicates packets.
	DupRate float64
	// ReorderRate holds packets and releases each behind the next one.
	ReorderRate float64
	// CERate sets ECN CE on ECN-capable packets (ECT(0)/ECT(1)), fixing
	// the IPv4 header checksum.
	CERate float64
	// CEAll also marks packets that are not ECN-capable.
	CEAll bool
	// DestQP, when FilterDestQP is set, limits every action to packets
	// whose BTH DestQP equals it (others are counted in Filtered).
	DestQP       uint32
	FilterDestQP bool
	// Congestion, when not nil, puts a congestion point on each hook:
	// a switch queue model that marks CE on its depth and drops at its
	// limit. See Congestion.
	Congestion *Congestion
}

// Congestion is a congestion point: a phantom (virtual) queue in front of
// a link of the given rate. Every RoCE packet that reaches it (after the
// DestQP filter and the drop rules) is added to the queue by its IP length
// (IP header, UDP header, BTH through ICRC; the unit DCQCN's rates count),
// and the queue drains at Rate whether or not packets are really held: the
// packet itself passes at once, so the model adds no delay, only the
// marking and dropping of a queue that deep.
//
// On arrival at depth d (bytes, before the packet is added):
//   - d + length > Limit: the packet is dropped (tail drop; CongDropped);
//   - d >= Kmax: it is marked CE;
//   - Kmin < d < Kmax: it is marked CE with probability Pmax·(d−Kmin)/(Kmax−Kmin),
//     as RED does on its average queue (here the instantaneous one, as
//     RoCE switches mark);
//   - otherwise it passes unmarked.
//
// Marking follows CERate's rules: only ECN-capable packets are marked
// (Not-ECT ones pass and count in CENotECT) unless CEAll is set; a packet
// already CE stays so. Marked packets count in both CEMarked and
// CongMarked. With Kmax = 0 the point only drops (no marking).
//
// Each hook has its own queue. Packets from several CPUs update it
// lock-free (atomic add and compare-and-exchange on the queue's tail time);
// the limit can be overshot by about one packet per CPU enqueuing at the
// same instant. The queue's clock counts from Load in 2^-14 ns units and
// runs 13 days; an injector kept longer must be loaded again. A UDP GSO datagram
// enters as its segments back to back: tail-dropped whole when its last
// segment would pass the limit, else enqueued whole, segment k finding the
// depth plus k segments (counted per segment). A packet that releases a
// held frame (ReorderRate) is counted in the queue but leaves unmarked.
type Congestion struct {
	// Rate is the drain rate in bits/s of IP datagrams (1 kb/s to 400 Gb/s).
	Rate uint64
	// Limit is the queue's size in bytes (1 to 1 GiB, and at most 1000 s
	// of draining at Rate).
	Limit uint32
	// Kmin and Kmax are the marking thresholds in bytes (Kmin <= Kmax <=
	// Limit); Kmax = 0 turns marking off.
	Kmin, Kmax uint32
	// Pmax is the marking probability at Kmax, in [0, 1].
	Pmax float64
}

// Congestion limits.
const (
	congMinRate  = 1000
	congMaxRate  = 400_000_000_000
	congMaxLimit = 1 << 30
	congMaxDrain = 1000 // seconds to drain a full queue (keeps the queue clock's arithmetic in 64 bits)
)

func (q *Congestion) validate() error {
	switch {
	case q.Rate < congMinRate || q.Rate > congMaxRate:
		return fmt.Errorf("faults: Congestion.Rate %d b/s outside [%d, %d]: %w", q.Rate, congMinRate, uint64(congMaxRate), ErrConfig)
	case q.Limit == 0 || q.Limit > congMaxLimit:
		return fmt.Errorf("faults: Congestion.Limit %d bytes outside [1, %d]: %w", q.Limit, congMaxLimit, ErrConfig)
	case math.IsNaN(q.Pmax) || q.Pmax < 0 || q.Pmax > 1:
		return fmt.Errorf("faults: Congestion.Pmax %v: %w", q.Pmax, ErrConfig)
	case float64(q.Limit)*8/float64(q.Rate) > congMaxDrain:
		return fmt.Errorf("faults: Congestion.Limit %d bytes takes over %v s to drain at %d b/s: %w", q.Limit, congMaxDrain, q.Rate, ErrConfig)
	case q.Kmax != 0 && (q.Kmin > q.Kmax || q.Kmax > q.Limit):
		return fmt.Errorf("faults: Congestion Kmin %d, Kmax %d, Limit %d: want Kmin <= Kmax <= Limit: %w", q.Kmin, q.Kmax, q.Limit, ErrConfig)
	}
	return nil
}

// nsPerByte returns the queue clock's time per byte (ns << qTimeShift).
func (q *Congestion) nsPerByte() uint64 {
	return uint64(math.Round(8e9 / float64(q.Rate) * (1 << qTimeShift)))
}

// bytesPerNs returns the drain per ns (bytes << 32).
func (q *Congestion) bytesPerNs() uint64 {
	return uint64(math.Round(float64(q.Rate) / 8e9 * (1 << 32)))
}

// slope returns Pmax·2^48/(Kmax−Kmin).
func (q *Congestion) slope() uint64 {
	if q.Kmax <= q.Kmin {
		return 0
	}
	return uint64(q.Pmax * (1 << 48) / float64(q.Kmax-q.Kmin))
}

// Validate reports a field out of range.
func (c *Config) Validate() error {
	for _, r := range []struct {
		name string
		v    float64
	}{{"DropRate", c.DropRate}, {"DupRate", c.DupRate}, {"ReorderRate", c.ReorderRate}, {"CERate", c.CERate}} {
		if math.IsNaN(r.v) || r.v < 0 || r.v > 1 {
			return fmt.Errorf("faults: %s %v: %w", r.name, r.v, ErrConfig)
		}
	}
	if c.DropPSN != nil && (c.DropPSN.First > 0xffffff || c.DropPSN.Last > 0xffffff) {
		return fmt.Errorf("faults: DropPSN %#x-%#x: PSNs are 24 bits: %w", c.DropPSN.First, c.DropPSN.Last, ErrConfig)
	}
	if c.FilterDestQP && c.DestQP > 0xffffff {
		return fmt.Errorf("faults: DestQP %#x: QPNs are 24 bits: %w", c.DestQP, ErrConfig)
	}
	if c.Congestion != nil {
		return c.Congestion.validate()
	}
	return nil
}

// ErrConfig is returned (wrapped) for a Config field out of range.
var ErrConfig = errors.New("invalid fault configuration")

// threshold converts a probability to the program's u32 threshold.
func threshold(rate float64) uint32 {
	if rate <= 0 {
		return 0
	}
	if rate >= 1 {
		return math.MaxUint32
	}
	return uint32(rate * (1 << 32))
}

// encode returns the config map value; base is the queue clock's origin.
func (c *Config) encode(base uint64) []byte {
	b := make([]byte, cfgSize)
	put := func(off int, v uint32) { ne.PutUint32(b[off:], v) }
	put(cfgDropThr, threshold(c.DropRate))
	put(cfgEveryN, c.DropEveryN)
	put(cfgDupThr, threshold(c.DupRate))
	put(cfgReorderThr, threshold(c.ReorderRate))
	put(cfgCEThr, threshold(c.CERate))
	var flags uint32
	if r := c.DropPSN; r != nil {
		flags |= flagPSN
		put(cfgPSNFirst, r.First)
		put(cfgPSNSpan, (r.Last-r.First)&0xffffff)
		put(cfgPSNLimit, r.Limit)
	}
	if c.CEAll {
		flags |= flagCEAll
	}
	if c.FilterDestQP {
		flags |= flagDestQP
		put(cfgDestQP, c.DestQP)
	}
	if q := c.Congestion; q != nil {
		flags |= flagCong
		ne.PutUint64(b[cfgQNsPerByte:], q.nsPerByte())
		ne.PutUint64(b[cfgQBytesPerNs:], q.bytesPerNs())
		ne.PutUint64(b[cfgQBase:], base)
		put(cfgQLimit, q.Limit)
		if q.Kmax > 0 {
			flags |= flagCongMark
			put(cfgQKmin, q.Kmin)
			put(cfgQKmax, q.Kmax)
			ne.PutUint64(b[cfgQSlope:], q.slope())
		}
	}
	put(cfgFlags, flags)
	return b
}

// Counters are the injector's per-action counts. They count RoCE packets
// on the wire: a GSO datagram's segments count one each (Seen, the drop
// reasons, CEMarked, Duplicated, the congestion point's counters), so
// Seen equals the packets the senders sent. GSO, GSODropped and
// GSOMarked count datagrams.
type Counters struct {
	Seen         uint64 // RoCE packets inspected (GSO segments included)
	Other        uint64 // non-RoCE packets passed untouched
	GSO          uint64 // GSO datagrams (one skb, several RoCE packets) inspected or skipped
	Filtered     uint64 // RoCE packets skipped by the DestQP filter
	DropRandom   uint64 // dropped at random (DropRate)
	DropNth      uint64 // dropped as every Nth
	DropPSN      uint64 // dropped by PSN range
	DropRequests uint64 // of all drops, request packets (not READ response, ACK, atomic ACK, CNP)
	Duplicated   uint64 // packets duplicated (clones sent)
	Held         uint64 // packets held for reordering
	Released     uint64 // held packets released behind a later packet
	CEMarked     uint64 // packets marked CE
	CENotECT     uint64 // chosen for CE but not ECN-capable (left unmarked)
	Errors       uint64 // helper failures (clone, rewrite, checksum, a GSO segment unreadable)
	OwnClones    uint64 // our own clones seen passing the hook again
	CongPassed   uint64 // congestion point: packets enqueued (not tail-dropped)
	CongMarked   uint64 // congestion point: packets marked CE on the queue's depth (also in CEMarked)
	CongDropped  uint64 // congestion point: tail drops at the limit
	QueueMax     uint64 // congestion point: largest depth after an enqueue, bytes (the maximum over hooks in a sum)
	GSOSegs      uint64 // packets (segments) in the GSO datagrams (in Seen unless skipped)
	GSOSkipped   uint64 // GSO datagrams passed whole uninspected: more than 128 segments, or not UDP GSO's layout
	GSODropped   uint64 // GSO datagrams dropped (their segments are in the drop counters)
	GSOMarked    uint64 // GSO datagrams marked CE (their segments are in CEMarked)
}

// Dropped is the number of packets dropped by any rule.
func (c Counters) Dropped() uint64 { return c.DropRandom + c.DropNth + c.DropPSN + c.CongDropped }

// add returns c + d field by field.
func (c Counters) add(d Counters) Counters {
	return Counters{Seen: c.Seen + d.Seen, Other: c.Other + d.Other, GSO: c.GSO + d.GSO, Filtered: c.Filtered + d.Filtered,
		DropRandom: c.DropRandom + d.DropRandom, DropNth: c.DropNth + d.DropNth, DropPSN: c.DropPSN + d.DropPSN,
		DropRequests: c.DropRequests + d.DropRequests, Duplicated: c.Duplicated + d.Duplicated, Held: c.Held + d.Held,
		Released: c.Released + d.Released, CEMarked: c.CEMarked + d.CEMarked, CENotECT: c.CENotECT + d.CENotECT,
		Errors: c.Errors + d.Errors, OwnClones: c.OwnClones + d.OwnClones, CongPassed: c.CongPassed + d.CongPassed,
		CongMarked: c.CongMarked + d.CongMarked, CongDropped: c.CongDropped + d.CongDropped, QueueMax: max(c.QueueMax, d.QueueMax),
		GSOSegs: c.GSOSegs + d.GSOSegs, GSOSkipped: c.GSOSkipped + d.GSOSkipped, GSODropped: c.GSODropped + d.GSODropped,
		GSOMarked: c.GSOMarked + d.GSOMarked}
}

// GSOString says how much of the traffic came as GSO datagrams:
// "gso=D datagrams/S segments (P% of packets)" ("gso=0 datagrams" without
// any), with the datagrams dropped, marked and skipped when there are any.
func (c Counters) GSOString() string {
	if c.GSO == 0 {
		return "gso=0 datagrams"
	}
	pct := 0.0
	if c.GSOSegs > 0 {
		// Seen holds the segments of the datagrams inspected; a skipped
		// datagram's are only in GSOSegs.
		pct = 100 * float64(c.GSOSegs) / float64(max(c.Seen, c.GSOSegs))
	}
	s := fmt.Sprintf("gso=%d datagrams/%d segments (%.1f%% of packets)", c.GSO, c.GSOSegs, pct)
	for _, x := range []struct {
		n string
		v uint64
	}{{"dropped", c.GSODropped}, {"marked", c.GSOMarked}, {"skipped", c.GSOSkipped}} {
		if x.v != 0 {
			s += fmt.Sprintf(" gso_%s=%d", x.n, x.v)
		}
	}
	return s
}

// String formats the counters: the main ones always, the GSO share
// always, the rest when not zero.
func (c Counters) String() string {
	s := fmt.Sprintf("seen=%d dropped=%d (random=%d nth=%d psn=%d requests=%d) dup=%d held=%d released=%d ce=%d",
		c.Seen, c.Dropped(), c.DropRandom, c.DropNth, c.DropPSN, c.DropRequests, c.Duplicated, c.Held, c.Released, c.CEMarked)
	if c.CongDropped != 0 {
		s = strings.Replace(s, " requests=", fmt.Sprintf(" congestion=%d requests=", c.CongDropped), 1)
	}
	s += " " + c.GSOString()
	for _, x := range []struct {
		n string
		v uint64
	}{{"other", c.Other}, {"filtered", c.Filtered}, {"ce_not_ect", c.CENotECT}, {"errors", c.Errors},
		{"cong_passed", c.CongPassed}, {"cong_marked", c.CongMarked}, {"cong_dropped", c.CongDropped}, {"queue_max", c.QueueMax}} {
		if x.v != 0 {
			s += fmt.Sprintf(" %s=%d", x.n, x.v)
		}
	}
	return s
}

// decodeCounters reads the counters from a state value.
func decodeCounters(b []byte) Counters {
	g := func(i int) uint64 { return ne.Uint64(b[stCounters+8*i:]) }
	return Counters{Seen: g(ctrSeen), Other: g(ctrOther), GSO: g(ctrGSO), Filtered: g(ctrFiltered),
		DropRandom: g(ctrDropRandom), DropNth: g(ctrDropNth), DropPSN: g(ctrDropPSN), DropRequests: g(ctrDropRequests),
		Duplicated: g(ctrDuplicated), Held: g(ctrHeld), Released: g(ctrReleased), CEMarked: g(ctrCEMarked),
		CENotECT: g(ctrCENotECT), Errors: g(ctrErrors), OwnClones: g(ctrOwnClones), CongPassed: g(ctrCongPassed),
		CongMarked: g(ctrCongMarked), CongDropped: g(ctrCongDropped), QueueMax: ne.Uint64(b[stQMax:]),
		GSOSegs: g(ctrGSOSegs), GSOSkipped: g(ctrGSOSkipped), GSODropped: g(ctrGSODropped), GSOMarked: g(ctrGSOMarked)}
}

// Injector is a loaded fault program with its maps, attached to an
// interface by Attach or only loaded by Load (for BPF_PROG_TEST_RUN).
type Injector struct {
	config, state *ebpf.Map
	progs         [numHooks]*ebpf.Program
	att           attachment                 // nil when only loaded
	base          uint64                     // CLOCK_MONOTONIC ns at Load: the congestion point's clock origin
	cong          atomic.Pointer[Congestion] // the congestion point last Set (a copy), nil without one
}

// Load loads the programs and maps without attaching them.
func Load(cfg Config) (*Injector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inj := &Injector{base: monotonicNs()}
	var err error
	inj.config, err = ebpf.NewMap(&ebpf.MapSpec{Name: "rv2f_config", Type: ebpf.Array, KeySize: 4, ValueSize: cfgSize, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("faults: config map: %w", err)
	}
	inj.state, err = ebpf.NewMap(&ebpf.MapSpec{Name: "rv2f_state", Type: ebpf.Array, KeySize: 4, ValueSize: stateSize, MaxEntries: uint32(numHooks)})
	if err != nil {
		inj.close()
		return nil, fmt.Errorf("faults: state map: %w", err)
	}
	if err := inj.Set(cfg); err != nil {
		inj.close()
		return nil, err
	}
	for h := range numHooks {
		spec := &ebpf.ProgramSpec{
			Name:         "rv2f_" + h.String(),
			Type:         ebpf.SchedCLS,
			License:      "Dual MIT/GPL",
			Instructions: program(inj.config.FD(), inj.state.FD(), uint32(h), h == Ingress),
		}
		p, err := ebpf.NewProgram(spec)
		if err != nil {
			inj.close()
			if perr := probeSkbFields(); perr != nil {
				return nil, perr
			}
			return nil, fmt.Errorf("faults: load %s program: %w", h, err)
		}
		inj.progs[h] = p
	}
	return inj, nil
}

// skbFields are the __sk_buff fields the program needs beyond the oldest
// tc programs' set, with the Linux release that made them readable.
var skbFields = []struct {
	off    int16
	name   string
	kernel string
}{
	{skbGSOSegs, "gso_segs", "5.1"},
	{skbGSOSize, "gso_size", "5.7"},
}

// probeSkbFields loads a two-instruction tc program per field of
// skbFields and names the first one the kernel refuses: on a kernel
// without them the injector cannot tell a GSO datagram's segments, and
// Load fails with this error rather than the verifier's log.
func probeSkbFields() error {
	for _, f := range skbFields {
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "rv2f_probe", Type: ebpf.SchedCLS, License: "Dual MIT/GPL",
			Instructions: asm.Instructions{
				asm.LoadMem(asm.R0, asm.R1, f.off, asm.Word),
				asm.Mov.Imm(asm.R0, actUnspec),
				asm.Return(),
			}})
		if err != nil {
			return fmt.Errorf("faults: this kernel's BPF cannot read __sk_buff.%s (Linux >= %s needed): "+
				"the injector must see the segments of UDP GSO datagrams: %w", f.name, f.kernel, err)
		}
		p.Close()
	}
	return nil
}

// Program returns the loaded program for hook h (for BPF_PROG_TEST_RUN).
func (inj *Injector) Program(h Hook) *ebpf.Program { return inj.progs[h] }

// Instructions returns the program for hook h as built (for inspection);
// map references are placeholders (fd 0).
func Instructions(h Hook) asm.Instructions { return program(0, 0, uint32(h), h == Ingress) }

// Set replaces the configuration; it takes effect for the next packet.
// Counters, the every-Nth sequence and the PSN drop budget keep counting
// (call ResetCounters to zero them).
func (inj *Injector) Set(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := inj.config.Put(uint32(0), cfg.encode(inj.base)); err != nil {
		return fmt.Errorf("faults: update config: %w", err)
	}
	var q *Congestion
	if cfg.Congestion != nil {
		c := *cfg.Congestion
		q = &c
	}
	inj.cong.Store(q)
	return nil
}

// QueueDepth returns the current depth in bytes of hook h's phantom queue
// (0 without a congestion point): what the program would see for a packet
// arriving now.
func (inj *Injector) QueueDepth(h Hook) (uint64, error) {
	if h < 0 || h >= numHooks {
		return 0, fmt.Errorf("faults: hook %d: %w", int(h), ErrConfig)
	}
	q := inj.cong.Load()
	if q == nil {
		return 0, nil
	}
	b := make([]byte, stateSize)
	if err := inj.state.Lookup(uint32(h), b); err != nil {
		return 0, fmt.Errorf("faults: read queue: %w", err)
	}
	tail := ne.Uint64(b[stQTail:])
	now := (monotonicNs() - inj.base) << qTimeShift
	if tail <= now {
		return 0, nil
	}
	// The enqueues added length × nsPerByte each: dividing by the same
	// constant gives their bytes back exactly (less the drain), where
	// multiplying by bytesPerNs — the program's rounded inverse, 4295/2^32
	// for 1000 bytes/s instead of 4294.97/2^32 — read a queue of 409,248
	// bytes as 409,250.
	if per := q.nsPerByte(); per > 0 {
		return (tail - now) / per, nil
	}
	return ((tail - now) >> qTimeShift) * q.bytesPerNs() >> 32, nil
}

// monotonicNs returns CLOCK_MONOTONIC in ns, the clock of
// bpf_ktime_get_ns.
func monotonicNs() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano())
}

// Counters returns the counters summed over the attached hooks.
func (inj *Injector) Counters() (Counters, error) {
	var sum Counters
	for h := range numHooks {
		c, err := inj.HookCounters(h)
		if err != nil {
			return Counters{}, err
		}
		sum = sum.add(c)
	}
	return sum, nil
}

// HookCounters returns the counters of one hook.
func (inj *Injector) HookCounters(h Hook) (Counters, error) {
	if h < 0 || h >= numHooks {
		return Counters{}, fmt.Errorf("faults: hook %d: %w", int(h), ErrConfig)
	}
	b := make([]byte, stateSize)
	if err := inj.state.Lookup(uint32(h), b); err != nil {
		return Counters{}, fmt.Errorf("faults: read counters: %w", err)
	}
	return decodeCounters(b), nil
}

// ResetCounters zeroes the counters, the every-Nth sequence and the PSN
// drop budget of every hook. A held frame is dropped.
func (inj *Injector) ResetCounters() error {
	zero := make([]byte, stateSize)
	for h := range numHooks {
		if err := inj.state.Put(uint32(h), zero); err != nil {
			return fmt.Errorf("faults: reset %s state: %w", h, err)
		}
	}
	return nil
}

// Close detaches the programs (if attached) and frees them and their maps.
func (inj *Injector) Close() error {
	var err error
	if inj.att != nil {
		err = inj.att.detach()
		inj.att = nil
	}
	inj.close()
	return err
}

func (inj *Injector) close() {
	for h, p := range inj.progs {
		if p != nil {
			p.Close()
			inj.progs[h] = nil
		}
	}
	if inj.config != nil {
		inj.config.Close()
		inj.config = nil
	}
	if inj.state != nil {
		inj.state.Close()
		inj.state = nil
	}
}
