//go:build linux

package interop

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// perftest -q 8 (labSuites): ib_write_bw, ib_read_bw, ib_send_bw and
// ib_atomic_bw with 8 QPs against rocev2d -q 8, as server and as client.
// Both sides exchange one QP data record per QP and post round-robin, -n
// per QP; the result row counts -n × 8. Besides every check of a clean
// cell (runCell: ICRC-verified capture, rxe's counters, no resends), the
// capture is followed per QP pair (rocev2d's address lines name them; with
// -R, multiQPCMCells, rdma_cm's MADs do), and
// the data-carrying packets are counted per destination QP: each of the
// 8 receiving QPs (the responders' for WRITE and SEND, the requesters'
// for READ responses and atomic ACKs) must get exactly -n messages' worth,
// from its peer. Where rocev2d sends known data (--check), it is checked
// at its place: each QP's regions hold the pattern from their start.
//
// The mismatch cells run rocev2d and the tool with -q 1 against -q 8 (both
// ways, both roles; ib_write_bw, and ib_send_bw, whose barrier comes
// before its second round of QP data): rocev2d must stop in the QP data
// exchange with an error naming both counts, the tool must fail too in
// its exchange ("Failed to exchange data between server and clients"),
// and not one RoCEv2 packet may cross the wire.
func init() { labSuites = append(labSuites, multiQPSuite) }

// multiQPs is the QP count of the cells.
const multiQPs = 8

// multiQPTx is the cells' tx depth per QP (-t). With the default (128,
// cut to -n) 8 QPs put 8 × 25 WRITEs of 4 packets in flight at once, a
// burst the 1-vCPU TCG VM's network stack dropped part of in one run
// (rxe's rcvd_pkts fell 347 short of what reached the tap). It must divide
// -n: perftest's CQ moderation is min(100, -t) and it signals every that
// many WRs; with -t 10 and -n 25 ib_send_bw's client stopped 5 short on
// one QP and spun (the VM's agent starved). 5 per QP: bursts of 160
// packets, below the single-QP cells' 512.
const multiQPTx = 5

func multiQPSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, c := range multiQPCells(lab.GIDIndex) {
		t.Run(c.name, func(t *testing.T) {
			r := row{cell: c.label, direction: c.direction(), result: "FAIL"}
			defer func() {
				if r.result == "FAIL" && r.packets == "" {
					r.counters = "stopped before the checks: " + r.counters
				}
				add(r)
			}()
			runCell(t, ctx, lab, img, c, &r)
		})
	}
	for _, m := range multiQPMismatchCells(lab.GIDIndex) {
		t.Run(m.name, func(t *testing.T) {
			r := row{cell: m.label, direction: m.direction(), result: "FAIL"}
			defer func() { add(r) }()
			runMismatchCell(t, ctx, lab, img, m, &r)
		})
	}
}

// perfAddr is one perftest address line: QPN and, for the RDMA tests,
// VAddr.
type perfAddr struct {
	qpn   uint32
	vaddr uint64
}

var rePerfAddrLine = regexp.MustCompile(`(?m)^ (local|remote) address: LID \S+ QPN (0x[0-9a-fA-F]+|0+) PSN \S+(?:.* VAddr (0x[0-9a-fA-F]+|0+))?`)

// reLocalRKey is the RKey of a perftest local address line.
var reLocalRKey = regexp.MustCompile(`(?m)^ local address: .* RKey (0x[0-9a-fA-F]+|0+) `)

// perfAddrs returns the local and remote address lines of a perftest
// output (perftest's or rocev2d's), in order.
func perfAddrs(out string) (local, remote []perfAddr) {
	for _, m := range rePerfAddrLine.FindAllStringSubmatch(out, -1) {
		q, _ := strconv.ParseUint(m[2], 0, 32)
		var va uint64
		if m[3] != "" {
			va, _ = strconv.ParseUint(m[3], 0, 64)
		}
		a := perfAddr{uint32(q), va}
		if m[1] == "local" {
			local = append(local, a)
		} else {
			remote = append(remote, a)
		}
	}
	return local, remote
}

// perfQPPairs returns rocev2d's QP pairs from its address lines: its QP i
// and the peer's QP i.
func perfQPPairs(hostOut string) ([][2]uint32, error) {
	loc, rem := perfAddrs(hostOut)
	if len(loc) != multiQPs || len(rem) != multiQPs {
		return nil, fmt.Errorf("%d local and %d remote address lines in rocev2d's output, want %d each", len(loc), len(rem), multiQPs)
	}
	pairs := make([][2]uint32, len(loc))
	for i := range loc {
		pairs[i] = [2]uint32{loc[i].qpn, rem[i].qpn}
	}
	return pairs, nil
}

// qpTally counts the data-carrying packets (not resent) each side sent,
// per destination QP.
type qpTally struct {
	host, vm map[uint32]int
}

func multiQPCells(gidIndex int) []cell {
	var cs []cell
	n := max(2*iters()/multiQPs, 5) // per QP: as many messages in all as the single-QP bw cells
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, pt := range []struct {
			tool, sub string
			size      int
			perMsg    int  // data packets per message at labMTU
			responses bool // the data flows back to the requester (READ, atomic)
			mrPerQP   bool // --mr_per_qp on both sides: 8 RKeys announced by each
		}{
			{"ib_write_bw", "write-bw", 4096, 4, false, false},
			{"ib_read_bw", "read-bw", 4096, 4, true, false},
			{"ib_send_bw", "send-bw", 4096, 4, false, false},
			{"ib_atomic_bw", "atomic-bw", 8, 1, true, false},
			{"ib_write_bw", "write-bw", 4096, 4, false, true},
		} {
			args := []string{"-q", strconv.Itoa(multiQPs), "-t", strconv.Itoa(multiQPTx), "-s", strconv.Itoa(pt.size), "-n", strconv.Itoa(n)}
			name := fmt.Sprintf("%s_q%d_%d_rocev2d_%s", pt.tool, multiQPs, pt.size, role)
			mrPerQP := pt.mrPerQP
			if mrPerQP {
				args = append(args, "--mr_per_qp")
				name = fmt.Sprintf("%s_q%d_mr_per_qp_rocev2d_%s", pt.tool, multiQPs, role)
			}
			label := strings.Join(append([]string{pt.tool}, args...), " ")
			ours := append([]string{pt.sub, "--bind", HostIP, "-v", "--timeout", "120s"}, args...)
			// rocev2d --check where it sends known data (or, atomics,
			// where its target starts at 0).
			check := (pt.sub == "write-bw" || pt.sub == "send-bw") && !server ||
				(pt.sub == "read-bw" || pt.sub == "atomic-bw") && server
			if check {
				ours = append(ours, "--check")
				label += " (rocev2d --check)"
			}
			tally := &qpTally{}
			sub, size, perMsg, responses := pt.sub, pt.size, pt.perMsg, pt.responses
			cs = append(cs, cell{
				name:     name,
				label:    label,
				tool:     fmt.Sprintf("%s -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(args, " ")),
				toolName: pt.tool,
				ours:     ours,
				check: func(who, out string) []string {
					p := checkPerftestOutput(who, out, size, n*multiQPs)
					if want := fmt.Sprintf(" Number of qps   : %d", multiQPs); !strings.Contains(out, want) {
						p = append(p, fmt.Sprintf("%s: no %q line", who, want))
					}
					loc, rem := perfAddrs(out)
					if len(loc) != multiQPs || len(rem) != multiQPs {
						p = append(p, fmt.Sprintf("%s: %d local and %d remote address lines, want %d each", who, len(loc), len(rem), multiQPs))
					}
					if mrPerQP {
						// Each side announces a buffer and an RKey per QP.
						keys := map[string]bool{}
						for _, m := range reLocalRKey.FindAllStringSubmatch(out, -1) {
							keys[m[1]] = true
						}
						if len(keys) != multiQPs {
							p = append(p, fmt.Sprintf("%s: %d distinct local RKeys, want %d (--mr_per_qp)", who, len(keys), multiQPs))
						}
					}
					if check && who == "rocev2d" && !strings.Contains(out, " data check: ok") {
						p = append(p, "rocev2d --check: no \"data check: ok\" line")
					}
					return p
				},
				data: func(hostOut string) (DataCheck, error) {
					return multiQPData(sub, server, check, hostOut, tally)
				},
				dataWhat: multiQPDataWhat(sub, check),
				qpPairs:  perfQPPairs,
				captureCheck: func(st *CaptureStats, hostOut, _ string) []string {
					return tally.problems(hostOut, server, responses, n*perMsg)
				},
				rocev2dServer: server,
				minPkts:       multiQPs * n * perMsg,
			})
		}
	}
	cs = append(cs, multiQPCMCells(gidIndex, n)...)
	return cs
}

// multiQPCMCells are the -R -q 8 cells: ib_write_bw and ib_send_bw, each QP
// connected through rdma_cm on its own (perftest's client connects them
// all at once, its server takes them as they come), the exchange over a
// ninth connection. Beyond the -q checks (the per-QP tally and data,
// without QP pairs from the address lines: rdma_cm pairs the QPs, in any
// order) the capture must show 9 connections made and torn down, each of
// rocev2d's QPs connected to one of the tool's, and no REJ but rxe's
// "invalid service ID" to a rocev2d client that asks before perftest
// listens.
func multiQPCMCells(gidIndex, n int) []cell {
	var cs []cell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, pt := range []struct{ tool, sub string }{{"ib_write_bw", "write-bw"}, {"ib_send_bw", "send-bw"}} {
			size, perMsg := 4096, 4
			args := []string{"-q", strconv.Itoa(multiQPs), "-t", strconv.Itoa(multiQPTx), "-s", strconv.Itoa(size), "-n", strconv.Itoa(n)}
			label := strings.Join(append([]string{pt.tool, "-R"}, args...), " ")
			ours := append([]string{pt.sub, "-R", "--bind", HostIP, "-v", "--timeout", "120s"}, args...)
			check := !server // rocev2d sends: the pattern
			if check {
				ours = append(ours, "--check")
				label += " (rocev2d --check)"
			}
			tally := &qpTally{}
			sub := pt.sub
			cs = append(cs, cell{
				name:     fmt.Sprintf("%s_R_q%d_%d_rocev2d_%s", pt.tool, multiQPs, size, role),
				label:    label,
				tool:     fmt.Sprintf("%s -R -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(args, " ")),
				toolName: pt.tool,
				ours:     ours,
				check: func(who, out string) []string {
					p := checkPerftestOutput(who, out, size, n*multiQPs)
					if want := fmt.Sprintf(" Number of qps   : %d", multiQPs); !strings.Contains(out, want) {
						p = append(p, fmt.Sprintf("%s: no %q line", who, want))
					}
					if !strings.Contains(out, " rdma_cm QPs\t : ON") {
						p = append(p, who+`: its header does not say "rdma_cm QPs : ON"`)
					}
					if check && who == "rocev2d" && !strings.Contains(out, " data check: ok") {
						p = append(p, "rocev2d --check: no \"data check: ok\" line")
					}
					return p
				},
				data: func(hostOut string) (DataCheck, error) {
					return multiQPData(sub, server, check, hostOut, tally)
				},
				dataWhat:      multiQPDataWhat(sub, check),
				rocev2dServer: server,
				port:          perfCMPort,
				waitVM:        func(ctx context.Context, lab *Lab) error { return waitCMListenVM(ctx, lab, perfCMPort, 20*time.Second) },
				captureCheck: func(st *CaptureStats, hostOut, _ string) []string {
					p := tally.problems(hostOut, server, false, n*perMsg)
					return append(p, checkMultiQPCM(st, hostOut, server)...)
				},
				minPkts: multiQPs * n * perMsg,
			})
		}
	}
	return cs
}

// checkMultiQPCM checks the CM MADs of a -R -q cell: 1 + multiQPs
// connections, each rocev2d QP of the address lines connected to one of
// the tool's QPs there, all torn down.
func checkMultiQPCM(st *CaptureStats, hostOut string, rocev2dServer bool) []string {
	var p []string
	want := 1 + multiQPs
	if len(st.CMPairs) != want {
		p = append(p, fmt.Sprintf("CM: %d connections (REQ answered by a REP), want %d (the exchange's and one per QP): %v", len(st.CMPairs), want, st.CM))
	}
	active := "vm"
	if !rocev2dServer {
		active = "host"
	}
	if st.CM[active+" RTU"] < want {
		p = append(p, fmt.Sprintf("CM: %d RTU from the client, want %d", st.CM[active+" RTU"], want))
	}
	if d, r := st.CM["host DREQ"]+st.CM["vm DREQ"], st.CM["host DREP"]+st.CM["vm DREP"]; d < want || r < want {
		p = append(p, fmt.Sprintf("CM: %d DREQ and %d DREP, want one of each per connection at least (%d)", d, r, want))
	}
	for k, v := range st.CM {
		if !strings.Contains(k, " REJ") || strings.HasSuffix(k, " REJ") || (k == "vm REJ invalid service ID" && !rocev2dServer) {
			continue
		}
		p = append(p, fmt.Sprintf("CM: %d %s", v, k))
	}
	loc, rem := perfAddrs(hostOut)
	remSet := map[uint32]bool{}
	for _, r := range rem {
		remSet[r.qpn] = true
	}
	for _, l := range loc {
		found := false
		for _, pr := range st.CMPairs {
			if pr[0] == l.qpn && remSet[pr[1]] {
				found = true
			}
		}
		if !found {
			p = append(p, fmt.Sprintf("CM: rocev2d's QP %#x is not connected to any of the tool's QPs %v (pairs {host, vm}: %#x)", l.qpn, rem, st.CMPairs))
		}
	}
	return p
}

// multiQPDataWhat says what a cell's data check checks.
func multiQPDataWhat(sub string, check bool) string {
	count := fmt.Sprintf("data packets counted per destination QP (%d QPs)", multiQPs)
	switch {
	case sub == "atomic-bw" && check:
		return count + "; every atomic result follows rocev2d's target from 0"
	case sub == "atomic-bw":
		return count + "; every atomic result follows rxe's target from its first value"
	case check && sub == "read-bw":
		return count + "; every READ response from rocev2d carries the --check pattern at its VA in its QP's region"
	case check && sub == "write-bw":
		return count + "; every WRITE from rocev2d carries the --check pattern at its VA in its QP's region"
	case check:
		return count + "; every SEND from rocev2d carries the --check pattern"
	}
	return count
}

// multiQPData returns the DataCheck of a -q cell: it tallies every
// first-sent data packet by sender and destination QP, and checks the data
// where rocev2d sent the --check pattern, at the offset in the region of
// the QP the packet belongs to.
func multiQPData(sub string, server, check bool, hostOut string, tally *qpTally) (DataCheck, error) {
	tally.host, tally.vm = map[uint32]int{}, map[uint32]int{}
	loc, rem := perfAddrs(hostOut)
	if len(loc) != multiQPs || len(rem) != multiQPs {
		return nil, fmt.Errorf("%d local and %d remote address lines in rocev2d's output, want %d each", len(loc), len(rem), multiQPs)
	}
	// The regions a packet's VA lies in: the peer's targets (WRITE) or
	// rocev2d's own (READ responses), one per QP in QP order, ascending
	// (perftest's layout and rocev2d's). QP i sends into region i (as
	// perftest: to the address the peer announced for index i) whichever
	// QP rdma_cm connected it to.
	var bases []uint64
	for i := range rem {
		if sub == "read-bw" {
			bases = append(bases, loc[i].vaddr)
		} else {
			bases = append(bases, rem[i].vaddr)
		}
	}
	// The test QPs each side sends to (with -R the exchange's QPs carry
	// SENDs too).
	toVM, toHost := map[uint32]bool{}, map[uint32]bool{}
	for i := range rem {
		toVM[rem[i].qpn], toHost[loc[i].qpn] = true, true
	}
	var atomic DataCheck
	if sub == "atomic-bw" {
		atomic = atomicData(check)
	}
	return func(p Payload) string {
		if p.UD != nil || (p.FromHost && !toVM[p.DestQP]) || (!p.FromHost && !toHost[p.DestQP]) {
			return "" // a MAD, or the exchange's connection (-R)
		}
		if !p.Resent {
			if p.FromHost {
				tally.host[p.DestQP]++
			} else {
				tally.vm[p.DestQP]++
			}
		}
		switch {
		case atomic != nil:
			return atomic(p)
		case !check || !p.FromHost:
			return ""
		case sub == "send-bw":
			if p.MsgOff < 0 {
				return "the message's first packet is not in the capture"
			}
			return patternAt(p.Data, p.MsgOff)
		}
		if !p.HasVA {
			return "no VA for the packet (WRITE without its FIRST, or a READ response without its request)"
		}
		b, ok := uint64(0), false
		for _, v := range bases {
			if v <= p.VA && v >= b {
				b, ok = v, true
			}
		}
		if !ok {
			return fmt.Sprintf("VA %#x below every QP's region %#x", p.VA, bases)
		}
		return patternAt(p.Data, int(p.VA-b))
	}, nil
}

// problems checks the tally: the receiving side's QPs (rocev2d's or the
// peer's, as its address lines say) each got exactly want data packets,
// and no other QP got any.
func (q *qpTally) problems(hostOut string, server, responses bool, want int) []string {
	loc, rem := perfAddrs(hostOut)
	// Who sends the data: the requester (WRITE, SEND) or the responder
	// (READ responses, atomic ACKs). rocev2d is the requester as client.
	hostSends := server == responses
	counts, dests, who := q.vm, loc, "rxe"
	if hostSends {
		counts, dests, who = q.host, rem, "rocev2d"
	}
	var p []string
	got := map[uint32]bool{}
	for _, d := range dests {
		got[d.qpn] = true
		if counts[d.qpn] != want {
			p = append(p, fmt.Sprintf("QP %#06x got %d data packets from %s, want %d", d.qpn, counts[d.qpn], who, want))
		}
	}
	if len(got) != multiQPs {
		p = append(p, fmt.Sprintf("%d distinct receiving QPs in the address lines, want %d", len(got), multiQPs))
	}
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		if !got[k] {
			p = append(p, fmt.Sprintf("%d data packets from %s to QP %#06x, which is not one of the test's", counts[k], who, k))
		}
	}
	if other := q.host; hostSends {
		other = q.vm
		if len(other) > 0 {
			p = append(p, fmt.Sprintf("the other side sent data packets too: %v", other))
		}
	} else if len(other) > 0 {
		p = append(p, fmt.Sprintf("the other side sent data packets too: %v", other))
	}
	return p
}

// mismatchCell is a -q mismatch: rocev2d with ourQPs against the tool
// with toolQPs.
type mismatchCell struct {
	name, label     string
	tool            string
	toolName        string
	ours            []string
	ourQPs, toolQPs int
	rocev2dServer   bool
}

func (m mismatchCell) direction() string { return cell{rocev2dServer: m.rocev2dServer}.direction() }

func multiQPMismatchCells(gidIndex int) []mismatchCell {
	var ms []mismatchCell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, mc := range []struct {
			tool, sub    string
			ours, theirs int
		}{
			// rocev2d with fewer QPs counts the tool's (perftest carries
			// on with its records); send_bw's barrier comes before its
			// second round, write_bw's after.
			{"ib_write_bw", "write-bw", 1, multiQPs},
			{"ib_send_bw", "send-bw", 1, multiQPs},
			// rocev2d with more QPs sees the tool's first record again.
			{"ib_write_bw", "write-bw", multiQPs, 1},
		} {
			ms = append(ms, mismatchCell{
				name:          fmt.Sprintf("%s_q%d_vs_rocev2d_q%d_%s", mc.tool, mc.theirs, mc.ours, role),
				label:         fmt.Sprintf("%s -q %d vs rocev2d -q %d (mismatch)", mc.tool, mc.theirs, mc.ours),
				tool:          fmt.Sprintf("%s -d rxe0 -x %d -F -q %d -s 4096 -n 20", mc.tool, gidIndex, mc.theirs),
				toolName:      mc.tool,
				ours:          []string{mc.sub, "--bind", HostIP, "-v", "--timeout", "60s", "-q", strconv.Itoa(mc.ours), "-s", "4096", "-n", "20"},
				ourQPs:        mc.ours,
				toolQPs:       mc.theirs,
				rocev2dServer: server,
			})
		}
	}
	return ms
}

// runMismatchCell runs a mismatch cell: both sides must fail in the
// exchange — rocev2d naming both counts, exactly (perftest carries on
// long enough for the side with fewer QPs to count the other's) — and the
// capture must hold no RoCEv2 packet, rxe's counters no traffic.
func runMismatchCell(t *testing.T, ctx context.Context, lab *Lab, img *Image, m mismatchCell, r *row) {
	t0 := time.Now()
	fatalf := func(format string, args ...any) {
		t.Helper()
		r.d = time.Since(t0)
		r.counters = strings.SplitN(fmt.Sprintf(format, args...), "\n", 2)[0]
		t.Fatalf(format, args...)
	}
	before, err := lab.Counters(ctx)
	if err != nil {
		fatalf("counters: %v", err)
	}
	pcapFile := filepath.Join(lab.Dir, m.name+".pcap")
	capt, err := lab.StartCapture(ctx, pcapFile)
	if err != nil {
		fatalf("capture: %v", err)
	}
	var hostCode int
	var hostOut string
	var vm agentproto.Response
	var vmErr error
	if m.rocev2dServer {
		h, err := lab.StartHost(ctx, img.Rocev2d, m.ours...)
		if err != nil {
			fatalf("start: %v", err)
		}
		if err := h.WaitListen(ppPort, 20*time.Second); err != nil {
			h.Cmd.Process.Signal(os.Interrupt)
			_, out := h.Wait()
			capt.Stop()
			fatalf("rocev2d server: %v\n%s", err, out)
		}
		vm, vmErr = lab.Run(ctx, m.tool+" "+HostIP, 60*time.Second)
		hostCode, hostOut = waitHost(h, 20*time.Second)
	} else {
		v, err := lab.StartVM(ctx, agentproto.Request{Cmd: m.tool, TimeoutSec: 60})
		if err != nil {
			fatalf("start: %v", err)
		}
		if err := lab.WaitListenVM(ctx, ppPort, 20*time.Second); err != nil {
			out, _ := v.Cancel()
			capt.Stop()
			fatalf("%s server in the VM: %v\n%s", m.toolName, err, out.Output)
		}
		h, err := lab.StartHost(ctx, img.Rocev2d, append(m.ours, VMIP)...)
		if err != nil {
			fatalf("start rocev2d: %v", err)
		}
		hostCode, hostOut = waitHost(h, 60*time.Second)
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		vm, vmErr = v.Wait(wctx)
		cancel()
		if vmErr != nil {
			vm, _ = v.Cancel()
		}
	}
	capt.Stop()
	after, cerr := lab.Counters(ctx)
	r.d = time.Since(t0)

	var problems []string
	if hostCode == 0 {
		problems = append(problems, "rocev2d exited 0")
	}
	for _, w := range []string{
		"QP count mismatch",
		fmt.Sprintf("the peer runs %s (-q %d)", qpWord(m.toolQPs), m.toolQPs),
		fmt.Sprintf("this side %s (-q %d)", qpWord(m.ourQPs), m.ourQPs),
	} {
		if !strings.Contains(hostOut, w) {
			problems = append(problems, fmt.Sprintf("rocev2d's error lacks %q", w))
		}
	}
	if vmErr != nil || vm.TimedOut {
		problems = append(problems, fmt.Sprintf("%s: %v (timed out %v)", m.toolName, vmErr, vm.TimedOut))
	} else if vm.Exit == 0 {
		problems = append(problems, m.toolName+" exited 0")
	} else if !strings.Contains(vm.Output, toolExchangeFailed) {
		problems = append(problems, fmt.Sprintf("%s did not fail in its exchange (no %q)", m.toolName, toolExchangeFailed))
	}
	for _, out := range []string{hostOut, vm.Output} {
		if strings.Contains(strings.ToLower(out), "retry") || reBWRow.MatchString(out) {
			problems = append(problems, "a side got as far as the data phase (a result row or a retry error)")
			break
		}
	}
	st, aerr := AnalyzeCaptureMTU(pcapFile, nil, nil, 0)
	if aerr != nil {
		problems = append(problems, "capture: "+aerr.Error())
		st = &CaptureStats{}
	}
	if st.RoCE != 0 {
		problems = append(problems, fmt.Sprintf("capture has %d RoCEv2 packets, want none (the mismatch must stop both before any traffic)", st.RoCE))
	}
	r.packets = fmt.Sprintf("%d (%d>vm %d<vm)", st.RoCE, st.FromHost, st.FromVM)
	if cerr != nil {
		problems = append(problems, "counters: "+cerr.Error())
	} else {
		for _, k := range []string{"sent_pkts", "rcvd_pkts"} {
			if d := int64(after[k]) - int64(before[k]); d != 0 {
				problems = append(problems, fmt.Sprintf("rxe counter %s moved by %d", k, d))
			}
		}
	}
	msg := hostOut
	if i := strings.Index(hostOut, "QP count mismatch"); i >= 0 {
		msg = hostOut[i:]
		if j := strings.IndexByte(msg, ';'); j > 0 {
			msg = msg[:j]
		}
	}
	r.counters = "rocev2d: " + strings.TrimSpace(msg) + "; " + m.toolName + ": " + toolExchangeFailed
	t.Logf("rocev2d (exit %d):\n%s\n%s (exit %d):\n%s", hostCode, hostOut, m.toolName, vm.Exit, vm.Output)
	if len(problems) > 0 {
		t.Errorf("%s:\n  %s", m.name, strings.Join(problems, "\n  "))
		return
	}
	r.result = "PASS"
}

// reBWRow matches a perftest bandwidth result row.
var reBWRow = regexp.MustCompile(`(?m)^\s*\d+\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s*$`)

func qpWord(n int) string {
	if n == 1 {
		return "1 QP"
	}
	return fmt.Sprintf("%d QPs", n)
}

// toolExchangeFailed is what perftest says when its out-of-band exchange
// loses its peer.
const toolExchangeFailed = "Failed to exchange data between server and clients"
