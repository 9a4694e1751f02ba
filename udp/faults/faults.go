//go:build linux

// Package faults is a fault injector for real network paths: a tc eBPF
// program, built in Go with cilium/ebpf's asm package (no clang), that
// drops, duplicates, reorders and ECN-marks RoCEv2 packets (UDP destination
// port 4791, IPv4 or IPv6) on an interface, with rates changeable at run
// time and per-action counters.
//
// The host kernel has no netem; the program replaces it for RoCE traffic.
// It attaches with TCX (kernel >= 6.6) or, when TCX is not available, as a
// cls_bpf direct-action filter under a clsact qdisc installed with iproute2's
// tc. See Config for the actions and Counters for what is counted.
//
// Per-packet faults need per-packet skbs: a UDP GSO super-packet (one skb
// carrying many datagrams, as a GSO sender produces on veth) is passed
// untouched and counted in Counters.GSO. Send without UDP GSO through an
// injector.
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

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
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
	// retries.
	Limit uint32
}

// Config selects the faults. The zero value passes everything. Rates are
// probabilities in [0, 1] applied independently per packet (drawn with
// bpf_get_prandom_u32 against a 32-bit threshold; 1 means all but a 2^-32
// fraction). A packet is tested in this order: DestQP filter, PSN range,
// every Nth, random drop, release of a held packet, reorder, CE mark,
// duplicate; a dropped packet is not also held, marked or duplicated.
type Config struct {
	// DropRate drops packets at random.
	DropRate float64
	// DropEveryN drops every Nth RoCE packet (the Nth, 2Nth, ... seen by a
	// hook since attach or ResetCounters). 0 disables. Beware: when a
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

// encode returns the config map value.
func (c *Config) encode() []byte {
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
	put(cfgFlags, flags)
	return b
}

// Counters are the injector's per-action packet counts.
type Counters struct {
	Seen         uint64 // RoCE packets inspected
	Other        uint64 // non-RoCE packets passed untouched
	GSO          uint64 // GSO super-packets passed untouched
	Filtered     uint64 // RoCE packets skipped by the DestQP filter
	DropRandom   uint64 // dropped at random (DropRate)
	DropNth      uint64 // dropped as every Nth
	DropPSN      uint64 // dropped by PSN range
	DropRequests uint64 // of all drops, request packets (not READ response, ACK, atomic ACK, CNP)
	Duplicated   uint64 // clones sent (duplicates)
	Held         uint64 // packets held for reordering
	Released     uint64 // held packets released behind a later packet
	CEMarked     uint64 // packets marked CE
	CENotECT     uint64 // chosen for CE but not ECN-capable (left unmarked)
	Errors       uint64 // helper failures (clone, rewrite, checksum)
	OwnClones    uint64 // our own clones seen passing the hook again
}

// Dropped is the number of packets dropped by any rule.
func (c Counters) Dropped() uint64 { return c.DropRandom + c.DropNth + c.DropPSN }

// add returns c + d field by field.
func (c Counters) add(d Counters) Counters {
	return Counters{c.Seen + d.Seen, c.Other + d.Other, c.GSO + d.GSO, c.Filtered + d.Filtered,
		c.DropRandom + d.DropRandom, c.DropNth + d.DropNth, c.DropPSN + d.DropPSN, c.DropRequests + d.DropRequests,
		c.Duplicated + d.Duplicated, c.Held + d.Held, c.Released + d.Released, c.CEMarked + d.CEMarked,
		c.CENotECT + d.CENotECT, c.Errors + d.Errors, c.OwnClones + d.OwnClones}
}

// String formats the non-zero counters.
func (c Counters) String() string {
	s := fmt.Sprintf("seen=%d dropped=%d (random=%d nth=%d psn=%d requests=%d) dup=%d held=%d released=%d ce=%d",
		c.Seen, c.Dropped(), c.DropRandom, c.DropNth, c.DropPSN, c.DropRequests, c.Duplicated, c.Held, c.Released, c.CEMarked)
	for _, x := range []struct {
		n string
		v uint64
	}{{"other", c.Other}, {"gso", c.GSO}, {"filtered", c.Filtered}, {"ce_not_ect", c.CENotECT}, {"errors", c.Errors}} {
		if x.v != 0 {
			s += fmt.Sprintf(" %s=%d", x.n, x.v)
		}
	}
	return s
}

// decodeCounters reads the counters from a state value.
func decodeCounters(b []byte) Counters {
	g := func(i int) uint64 { return ne.Uint64(b[stCounters+8*i:]) }
	return Counters{g(ctrSeen), g(ctrOther), g(ctrGSO), g(ctrFiltered), g(ctrDropRandom), g(ctrDropNth),
		g(ctrDropPSN), g(ctrDropRequests), g(ctrDuplicated), g(ctrHeld), g(ctrReleased), g(ctrCEMarked),
		g(ctrCENotECT), g(ctrErrors), g(ctrOwnClones)}
}

// Injector is a loaded fault program with its maps, attached to an
// interface by Attach or only loaded by Load (for BPF_PROG_TEST_RUN).
type Injector struct {
	config, state *ebpf.Map
	progs         [numHooks]*ebpf.Program
	att           attachment // nil when only loaded
}

// Load loads the programs and maps without attaching them.
func Load(cfg Config) (*Injector, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inj := &Injector{}
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
			return nil, fmt.Errorf("faults: load %s program: %w", h, err)
		}
		inj.progs[h] = p
	}
	return inj, nil
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
	if err := inj.config.Put(uint32(0), cfg.encode()); err != nil {
		return fmt.Errorf("faults: update config: %w", err)
	}
	return nil
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
