//go:build linux

package interop

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/gorocev2/rocev2/udp/faults"
)

// lossRate is the random drop probability of the loss cells, applied in
// both directions on the tap between the lab's bridge and the VM.
const lossRate = 0.01

// lossExpected are the rxe counters that lost packets move; under loss they
// are reported, not failures (duplicate_request: rxe received a request
// rocev2d resent). retry_exceeded_err, the RNR counters and
// send_err still fail a loss cell.
var lossExpected = map[string]bool{"out_of_seq_request": true, "rcvd_seq_err": true, "duplicate_request": true}

// lossCells returns the perftest bandwidth cells (WRITE, READ, SEND, both
// atomics; rocev2d as server and as client) again, with 1 % random drop on
// the tap: both stacks' retransmission paths meet each other. rocev2d runs
// with -v so its counters (retransmitted_pkts) are in its output.
func lossCells(gidIndex int) []cell {
	var out []cell
	for _, c := range cells(gidIndex) {
		if !strings.HasPrefix(c.name, "ib_") || !strings.Contains(c.name, "_bw_") {
			continue
		}
		c.name = strings.Replace(c.name, "_rocev2d_", "_loss1pct_rocev2d_", 1)
		c.label += fmt.Sprintf(" @%g%% loss", lossRate*100)
		c.loss = lossRate
		c.wantPkts = 0
		out = append(out, c)
	}
	return out
}

// lossInjector is the eBPF fault injector on the lab's tap for one cell.
type lossInjector struct{ inj *faults.Injector }

// attachLoss drops RoCEv2 packets at random on both hooks of the tap:
// egress = host -> VM, ingress = VM -> host. tcpdump on the tap sees the
// VM's packets before the ingress drop and the host's after the egress
// drop, so the capture checks (rxe sent = captured from rxe, rxe received
// = captured from the host) still hold.
func attachLoss(lab *Lab, rate float64) (*lossInjector, error) {
	return attachFaults(lab, faults.Config{DropRate: rate})
}

// attachFaults attaches the injector with cfg on both hooks of the tap,
// as attachLoss.
func attachFaults(lab *Lab, cfg faults.Config) (*lossInjector, error) {
	inj, err := faults.AttachWith(Tap, cfg, &faults.Options{Netns: lab.NS, Egress: true, Ingress: true})
	if err != nil {
		return nil, err
	}
	return &lossInjector{inj}, nil
}

func (l *lossInjector) close() { l.inj.Close() }

var reRetrans = regexp.MustCompile(`retransmitted_pkts\s+(\d+)`)

// ourRetransmissions is rocev2d's retransmitted_pkts from its -v output.
func ourRetransmissions(out string) int64 {
	m := reRetrans.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// summary is the table's note: drops per direction and rocev2d's
// retransmissions (and ack_timeout_busy, retry_exceeded_err when not 0).
func (l *lossInjector) summary(hostOut string) string {
	eg, _ := l.inj.HookCounters(faults.Egress)
	in, _ := l.inj.HookCounters(faults.Ingress)
	s := fmt.Sprintf("dropped >vm %d/%d <vm %d/%d rocev2d_retransmitted=%d",
		eg.Dropped(), eg.Seen, in.Dropped(), in.Seen, ourRetransmissions(hostOut))
	// The READ go-back-N's excused expiries and a WQE out of retries,
	// when there were any.
	if ours, err := ourCounters(hostOut); err == nil {
		for _, k := range []string{"ack_timeout_busy", "retry_exceeded_err"} {
			if ours[k] != 0 {
				s += fmt.Sprintf(" rocev2d_%s=%d", k, ours[k])
			}
		}
	}
	return s
}

// problems checks that the faults were applied and recovered from.
func (l *lossInjector) problems(rxeRetries int64, hostOut string) []string {
	eg, err1 := l.inj.HookCounters(faults.Egress)
	in, err2 := l.inj.HookCounters(faults.Ingress)
	if err1 != nil || err2 != nil {
		return []string{fmt.Sprintf("injector counters: %v %v", err1, err2)}
	}
	var p []string
	// GSO datagrams are faulted per segment; only a skipped one (a layout
	// the injector could not read) escaped the faults.
	if eg.GSOSkipped+in.GSOSkipped+eg.Errors+in.Errors > 0 {
		p = append(p, fmt.Sprintf("injector passed GSO datagrams unread or failed: egress %v ingress %v", eg, in))
	}
	if eg.Seen == 0 || in.Seen == 0 {
		p = append(p, fmt.Sprintf("injector saw no RoCEv2 traffic: egress %v ingress %v", eg, in))
	}
	// A dropped request must be sent again: host->VM by rocev2d, VM->host
	// by rxe (completer_retry_err, counted in rxeRetries).
	if eg.DropRequests+in.DropRequests > 0 && rxeRetries == 0 && ourRetransmissions(hostOut) == 0 {
		p = append(p, fmt.Sprintf("%d request packets dropped but neither side retransmitted", eg.DropRequests+in.DropRequests))
	}
	return p
}

// busyPollCells returns the latency cells (ibv_rc_pingpong 64 B,
// ib_write_lat, ib_read_lat; rocev2d as server and as client) again with
// rocev2d's receive busy polling on (--busy-poll=100us): the polling path
// meets rxe with every check of a clean cell.
func busyPollCells(gidIndex int) []cell {
	var out []cell
	for _, c := range cells(gidIndex) {
		if c.inproc != nil || !(strings.HasPrefix(c.name, "rc_pingpong_64_") || strings.Contains(c.name, "_lat_")) {
			continue
		}
		c.name = strings.Replace(c.name, "_rocev2d_", "_busypoll_rocev2d_", 1)
		c.label += " (rocev2d --busy-poll=100us)"
		c.ours = append(slices.Clone(c.ours), "--busy-poll=100us")
		out = append(out, c)
	}
	return out
}
