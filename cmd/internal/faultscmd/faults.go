//go:build linux

package faultscmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gorocev2/rocev2/cmd/internal/cli"
	"github.com/gorocev2/rocev2/udp/faults"
)

func init() {
	commands.Register("faults", "inject drops, duplicates, reordering and ECN CE marks into RoCEv2 traffic on an interface (eBPF, root)", faultsUsage, runFaults)
}

const faultsUsage = `usage: rocev2d faults [options] IFACE

Attaches a tc eBPF program (TCX on kernels >= 6.6, else a cls_bpf
direct-action filter under clsact via iproute2's tc) to IFACE and applies the
chosen faults to RoCEv2 packets only (UDP destination port 4791, IPv4 or
IPv6); everything else passes untouched. The kernel needs no netem. Counters
are printed every interval; SIGINT/SIGTERM (or the end of --duration)
detaches the program and prints the totals. Needs root (CAP_BPF and
CAP_NET_ADMIN). The congestion point of package udp/faults (a phantom
switch queue that marks and tail-drops, faults.Config.Congestion) has no
flags here: it is Go API only (docs/CONGESTION.md).

Faults (rates are probabilities 0..1, drawn per packet):
  --drop=RATE        drop at random
  --every=N          drop every Nth RoCE packet of a hook (keep N above the
                     sender's window, 128: a retransmission flight of exactly
                     N packets loses its first packet in every retry)
  --psn=FIRST[-LAST] drop the packets whose BTH PSN is in the range
                     (decimal or 0x hex, 24 bits, may wrap)
  --psn-limit=N      stop PSN-range drops after N per hook (default 0 = never
                     stop: a range covering requests is then a black hole)
  --dup=RATE         duplicate (the copy leaves just before the original)
  --reorder=RATE     hold the packet and release it right after the next one
                     through the same hook
  --ce=RATE          set ECN CE on ECN-capable packets (IPv4 checksum fixed)
  --ce-all           also mark packets that are not ECN-capable
  --qp=QPN           limit all faults to packets for this BTH DestQP

Where:
  --netns=NAME       IFACE's network namespace (name under /var/run/netns or
                     a path); default: the current one
  --egress           fault packets leaving IFACE (the default)
  --ingress          fault packets arriving on IFACE (with --egress: both
                     directions of IFACE's traffic)
  --mode=MODE        auto (default), tcx or tc

Output:
  -i, --interval=DUR print counters this often (default 1s; 0 = only at the end)
  -d, --duration=DUR detach after this long (default 0 = until SIGINT)

UDP GSO (rocev2d sends with it by default on lo and veth; tc sees one
GSO datagram, one skb, for up to 64 RoCE packets, which the receiver or
the device cuts into segments later): every segment is a packet of its own
for the rules. Each segment's BTH is read; the DestQP filter, --psn,
--every (counting segments) and the random draws (--drop, --ce, --dup,
per segment: a datagram of n segments is hit with probability
1-(1-RATE)^n) select segments, and what one segment draws applies to the
whole datagram: it is dropped, CE-marked (its one IP header is copied into
every segment) or duplicated whole, and counted once per segment. (The
congestion point of the Go API, faults.Config.Congestion, which this
command does not set, takes them back to back.) --psn-limit counts the
in-range segments of the datagrams dropped. GSO datagrams are never held
by --reorder (a held single packet leaves behind the next datagram). So
with GSO more packets are hit than RATE says (a datagram goes whole); for
per-packet rates send with --gso=false. The counters count packets
(segments); gso=D datagrams/S segments says how much of the traffic came
as GSO, gso_dropped and gso_marked count datagrams, gso_skipped the ones
passed whole (more than 128 segments, or not UDP GSO's layout). Needs
Linux >= 5.7 (__sk_buff gso_size). More in docs/FAULTS.md.

Example (the veth test setup: namespaces A and B, veth va in A):
  rocev2d faults --netns A --egress --ingress --drop 0.01 --reorder 0.01 va
`

// faultsConfig is the parsed command line of rocev2d faults.
type faultsConfig struct {
	iface    string
	cfg      faults.Config
	opts     faults.Options
	interval time.Duration
	duration time.Duration
}

func parseRate(name, s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || v < 0 || v > 1 {
		return 0, fmt.Errorf("--%s %q: want a probability between 0 and 1", name, s)
	}
	return v, nil
}

func parsePSN(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil || v > 0xffffff {
		return 0, fmt.Errorf("PSN %q: want a 24-bit number (decimal or 0x hex)", s)
	}
	return uint32(v), nil
}

func parseFaultsFlags(args []string) (*faultsConfig, error) {
	c := &faultsConfig{}
	fs := flag.NewFlagSet("rocev2d faults", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var drop, dup, reorder, ce, psn, mode, qp string
	var every, psnLimit uint
	fs.StringVar(&drop, "drop", "0", "")
	fs.StringVar(&dup, "dup", "0", "")
	fs.StringVar(&reorder, "reorder", "0", "")
	fs.StringVar(&ce, "ce", "0", "")
	fs.BoolVar(&c.cfg.CEAll, "ce-all", false, "")
	fs.UintVar(&every, "every", 0, "")
	fs.StringVar(&psn, "psn", "", "")
	fs.UintVar(&psnLimit, "psn-limit", 0, "")
	fs.StringVar(&qp, "qp", "", "")
	fs.StringVar(&c.opts.Netns, "netns", "", "")
	fs.BoolVar(&c.opts.Egress, "egress", false, "")
	fs.BoolVar(&c.opts.Ingress, "ingress", false, "")
	fs.StringVar(&mode, "mode", "auto", "")
	fs.DurationVar(&c.interval, "i", time.Second, "")
	fs.DurationVar(&c.interval, "interval", time.Second, "")
	fs.DurationVar(&c.duration, "d", 0, "")
	fs.DurationVar(&c.duration, "duration", 0, "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch fs.NArg() {
	case 0:
		return nil, errors.New("missing IFACE")
	case 1:
		c.iface = fs.Arg(0)
	default:
		return nil, fmt.Errorf("unexpected argument %q (flags go before IFACE)", fs.Arg(1))
	}
	var err error
	if c.cfg.DropRate, err = parseRate("drop", drop); err != nil {
		return nil, err
	}
	if c.cfg.DupRate, err = parseRate("dup", dup); err != nil {
		return nil, err
	}
	if c.cfg.ReorderRate, err = parseRate("reorder", reorder); err != nil {
		return nil, err
	}
	if c.cfg.CERate, err = parseRate("ce", ce); err != nil {
		return nil, err
	}
	if c.cfg.CEAll && c.cfg.CERate == 0 {
		return nil, errors.New("--ce-all: marks nothing without --ce (a CE-marking rate above 0)")
	}
	if every > math.MaxUint32 {
		return nil, fmt.Errorf("--every %d: too large", every)
	}
	c.cfg.DropEveryN = uint32(every)
	if psn != "" {
		first, last, _ := strings.Cut(psn, "-")
		if last == "" {
			last = first
		}
		r := &faults.PSNRange{}
		if r.First, err = parsePSN(first); err != nil {
			return nil, fmt.Errorf("--psn: %w", err)
		}
		if r.Last, err = parsePSN(last); err != nil {
			return nil, fmt.Errorf("--psn: %w", err)
		}
		if psnLimit > math.MaxUint32 {
			return nil, fmt.Errorf("--psn-limit %d: too large", psnLimit)
		}
		r.Limit = uint32(psnLimit)
		c.cfg.DropPSN = r
	} else if psnLimit != 0 {
		return nil, errors.New("--psn-limit needs --psn")
	}
	if qp != "" {
		v, err := strconv.ParseUint(qp, 0, 32)
		if err != nil || v > 0xffffff {
			return nil, fmt.Errorf("--qp %q: want a 24-bit QPN", qp)
		}
		c.cfg.DestQP, c.cfg.FilterDestQP = uint32(v), true
	}
	switch mode {
	case "auto":
		c.opts.Mode = faults.ModeAuto
	case "tcx":
		c.opts.Mode = faults.ModeTCX
	case "tc":
		c.opts.Mode = faults.ModeTC
	default:
		return nil, fmt.Errorf("--mode %q: want auto, tcx or tc", mode)
	}
	if c.interval < 0 || c.duration < 0 {
		return nil, errors.New("--interval and --duration must not be negative")
	}
	if c.interval > 0 && c.interval < 10*time.Millisecond {
		return nil, fmt.Errorf("--interval %v: at least 10ms", c.interval)
	}
	return c, nil
}

func runFaults(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseFaultsFlags(args)
	if code, done := cli.FlagsResult("faults", faultsUsage, err, stdout, stderr); done {
		return code
	}
	inj, err := faults.AttachWith(c.iface, c.cfg, &c.opts)
	if err != nil {
		fmt.Fprintf(stderr, "rocev2d faults: %v\n", err)
		return cli.ExitFail
	}
	hooks := hookNames(&c.opts)
	fmt.Fprintf(stdout, "rocev2d faults: attached to %s (%s)%s: %s\n", c.iface, strings.Join(hooks, "+"), nsSuffix(c.opts.Netns), describeFaults(&c.cfg))
	fmt.Fprintf(stdout, "rocev2d faults: UDP GSO datagrams are faulted per segment (a segment's draw drops, marks or duplicates its whole datagram, counted per segment; never held for --reorder); gso= shows their share\n")
	if c.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.duration)
		defer cancel()
	}
	start := time.Now()
	var tick <-chan time.Time
	if c.interval > 0 {
		t := time.NewTicker(c.interval)
		defer t.Stop()
		tick = t.C
	}
	status := cli.ExitOK
	print := func(prefix string) {
		line := fmt.Sprintf("%s%7.1fs", prefix, time.Since(start).Seconds())
		for _, h := range []faults.Hook{faults.Egress, faults.Ingress} {
			if !hookOn(&c.opts, h) {
				continue
			}
			ctr, err := inj.HookCounters(h)
			if err != nil {
				fmt.Fprintf(stderr, "rocev2d faults: %v\n", err)
				status = cli.ExitFail
				return
			}
			line += fmt.Sprintf(" | %s: %v", h, ctr)
		}
		fmt.Fprintln(stdout, line)
	}
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick:
			print("")
		}
	}
	print("total ")
	if status == cli.ExitOK {
		for _, h := range []faults.Hook{faults.Egress, faults.Ingress} {
			if ctr, err := inj.HookCounters(h); err == nil && hookOn(&c.opts, h) {
				fmt.Fprintf(stdout, "rocev2d faults: %s: %s\n", h, gsoSummary(ctr))
			}
		}
	}
	if err := inj.Close(); err != nil {
		fmt.Fprintf(stderr, "rocev2d faults: detach: %v\n", err)
		return cli.ExitFail
	}
	fmt.Fprintf(stdout, "rocev2d faults: detached from %s\n", c.iface)
	return status
}

func hookOn(o *faults.Options, h faults.Hook) bool {
	if !o.Egress && !o.Ingress {
		return h == faults.Egress
	}
	return (h == faults.Egress && o.Egress) || (h == faults.Ingress && o.Ingress)
}

func hookNames(o *faults.Options) []string {
	var n []string
	for _, h := range []faults.Hook{faults.Egress, faults.Ingress} {
		if hookOn(o, h) {
			n = append(n, h.String())
		}
	}
	return n
}

func nsSuffix(ns string) string {
	if ns == "" {
		return ""
	}
	return " in netns " + ns
}

// describeFaults is a one-line summary of the configuration.
func describeFaults(c *faults.Config) string {
	var p []string
	add := func(name string, v float64) {
		if v > 0 {
			p = append(p, fmt.Sprintf("%s %g%%", name, v*100))
		}
	}
	add("drop", c.DropRate)
	if c.DropEveryN > 0 {
		p = append(p, fmt.Sprintf("drop every %d-th", c.DropEveryN))
	}
	if r := c.DropPSN; r != nil {
		s := fmt.Sprintf("drop PSN %#06x-%#06x", r.First, r.Last)
		if r.Limit > 0 {
			s += fmt.Sprintf(" (at most %d per hook)", r.Limit)
		}
		p = append(p, s)
	}
	add("dup", c.DupRate)
	add("reorder", c.ReorderRate)
	add("CE", c.CERate)
	if c.CEAll && c.CERate > 0 {
		p = append(p, "CE also on non-ECT")
	}
	if c.FilterDestQP {
		p = append(p, fmt.Sprintf("only DestQP %#x", c.DestQP))
	}
	if len(p) == 0 {
		return "no faults (counting only)"
	}
	return strings.Join(p, ", ")
}

// gsoSummary says how much of a hook's traffic came as GSO datagrams and
// what the faults did to them.
func gsoSummary(c faults.Counters) string {
	if c.GSO == 0 {
		return fmt.Sprintf("no GSO datagrams; %d packets, each its own skb", c.Seen)
	}
	s := fmt.Sprintf("%d of %d packets came in %d GSO datagrams (%.1f per datagram)",
		c.GSOSegs, max(c.Seen, c.GSOSegs), c.GSO, float64(c.GSOSegs)/float64(c.GSO))
	if c.GSODropped+c.GSOMarked > 0 {
		s += fmt.Sprintf("; %d datagrams dropped, %d marked CE", c.GSODropped, c.GSOMarked)
	}
	if c.GSOSkipped > 0 {
		s += fmt.Sprintf("; %d passed whole uninspected (gso_skipped)", c.GSOSkipped)
	}
	return s
}
