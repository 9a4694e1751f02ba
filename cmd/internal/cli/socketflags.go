package cli

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"time"

	"github.com/gorocev2/rocev2/udp"
)

// SocketUsage documents the options AddSocketFlags registers; the commands
// that open UDP socket links (demo, bench, pingpong, the perftest commands)
// list it with their options.
const SocketUsage = `  --gso[=BOOL]   send each run of equal-size packets to one peer (the
                 packets of a multi-packet message, a batch of READ
                 responses or ACKs) as one UDP GSO datagram
                 (UDP_SEGMENT): about twice the packet rate of plain
                 sendmmsg. Linux numbers the segments' IPv4
                 identifications upward and each ICRC is computed for its
                 segment. Default: on where the kernel segments (the
                 device holding the local address is lo, a veth or
                 another virtual device, or a NIC without
                 tx-udp-segmentation, as ethtool's netlink features say),
                 off where a NIC segments in hardware (it must number the
                 identifications the same way: check with a capture
                 before --gso=true there). A 'rocev2d faults' injector
                 faults GSO datagrams per segment (see its help).
  --busy-poll=DUR   poll the UDP socket without blocking for up to DUR
                 (e.g. 100us) before sleeping in each receive: CPU for
                 latency, like the ibv_poll_cq loops of ibv_rc_pingpong
                 and perftest's latency tests. Off by default, except
                 in the ping-pongs (pingpong, uc-, ud-, srq-pingpong)
                 and the *-lat tests: 100us unless -e or the machine
                 has one CPU.
  --share[=BOOL]  share the address's UDP port 4791 with other processes
                 (an SO_REUSEPORT group whose eBPF program hands each
                 packet to the process owning its destination QP, CM
                 listener or connection; 'rocev2d share status ADDR'
                 lists them). Default: on where the process may load the
                 program (CAP_BPF and CAP_NET_ADMIN, CAP_SYS_ADMIN
                 standing for either; e.g. root), else the address is
                 this process's alone. --share fails at
                 once without them; --share=false never shares.
` + CCUsage

// DefaultBusyPoll is how long the latency commands (the four ping-pongs
// and the perftest *-lat tests, without -e) poll their socket before
// sleeping in a receive, unless --busy-poll says otherwise: the real tools
// poll their CQ without pause, and waking an idle thread costs tens of µs
// on a VM.
const DefaultBusyPoll = 100 * time.Microsecond

// SocketFlags holds the --gso and --busy-poll options of one command, and
// its congestion control options (ccflags.go).
type SocketFlags struct {
	CC          CCFlags // --ecn, --cnp-interval, --dcqcn, --dcqcn-param
	GSO         bool
	GSOSet      bool // --gso was given (else the device decides: udp.SocketOptions.GSOAuto)
	BusyPoll    time.Duration
	BusyPollSet bool // --busy-poll was given (0 switches polling off)
	Share       udp.ShareMode
}

// AddSocketFlags registers --gso and --busy-poll=DUR in fs, storing their
// values in f. Like every flag of the commands that take a positional
// argument (pingpong, the perftest commands), they may also follow it.
func AddSocketFlags(fs *flag.FlagSet, f *SocketFlags) {
	AddCCFlags(fs, &f.CC)
	fs.Var(gsoFlag{f}, "gso", "")
	fs.Var(shareFlag{f}, "share", "")
	fs.Func("busy-poll", "", func(val string) error {
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 || d > time.Second {
			return fmt.Errorf("want a duration between 0 and 1s (e.g. 100us)")
		}
		f.BusyPoll, f.BusyPollSet = d, true
		return nil
	})
}

// gsoFlag is --gso[=BOOL]: a boolean flag that records that it was given.
type gsoFlag struct{ f *SocketFlags }

func (g gsoFlag) String() string {
	if g.f == nil || !g.f.GSOSet {
		return "auto"
	}
	return strconv.FormatBool(g.f.GSO)
}

func (g gsoFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false (without it: on where the kernel segments)")
	}
	g.f.GSO, g.f.GSOSet = v, true
	return nil
}

func (g gsoFlag) IsBoolFlag() bool { return true }

// shareFlag is --share[=BOOL]: absent means udp.ShareAuto.
type shareFlag struct{ f *SocketFlags }

func (g shareFlag) String() string {
	if g.f == nil {
		return "auto"
	}
	return g.f.Share.String()
}

func (g shareFlag) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false (without it: shared where the process may)")
	}
	g.f.Share = udp.ShareOff
	if v {
		g.f.Share = udp.ShareOn
	}
	return nil
}

func (g shareFlag) IsBoolFlag() bool { return true }

// options returns the socket options of a command's link: UDP GSO as --gso
// says, or without it as the device holding the local address says
// (udp.SocketOptions.GSOAuto: on unless a NIC segments in hardware); no
// busy polling unless poll (latency commands without -e, demo,
// bench), and then --busy-poll's duration, or def when it was not given.
func (f SocketFlags) Options(poll bool, def time.Duration) udp.SocketOptions {
	o := udp.SocketOptions{GSO: f.GSO, GSOAuto: !f.GSOSet, Share: f.Share}
	switch {
	case !poll:
	case f.BusyPollSet:
		o.BusyPoll = f.BusyPoll
	case OneCPU:
		// Busy polling on the only CPU takes it from the kernel's
		// receive path and the device's own goroutines: in the interop
		// lab's 1-vCPU VMs busy polling (100 µs, once 1 ms) made rocev2d
		// pingpong fail with "transport retry counter exceeded" in 3 of
		// 10 runs and was the slowest variant in every round (1.2-4.4x
		// the RTT of --busy-poll=0, which failed once in about 40 runs;
		// test/interop BenchmarkVM).
	default:
		o.BusyPoll = def
	}
	return o
}

// OneCPU reports a machine with a single CPU, where the latency commands
// do not busy-poll unless --busy-poll says so (a variable for tests).
var OneCPU = runtime.NumCPU() < 2
