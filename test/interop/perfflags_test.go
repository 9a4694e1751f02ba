//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func init() { labSuites = append(labSuites, perfCMRejectSuite) }

// perfCMRejectSuite: perftest's client with -R, and with -z (rdma_cm for
// the exchange only), against a rocev2d server without -R: the CM REQ must
// get a REJ, so that the tool stops at once with librdmacm's REJECTED event
// (8), as against perftest's own server without -R. Before, the shared
// port dropped the REQ, the kernel answered ICMP port unreachable, which
// rxe ignores, and the tool retried for minutes. The server keeps waiting
// for a TCP client (as perftest's) and is interrupted.
func perfCMRejectSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, mode := range []string{"-R", "-z"} {
		name := "ib_write_bw_" + strings.TrimPrefix(mode, "-") + "_vs_rocev2d_without_R"
		t.Run(name, func(t *testing.T) {
			t0 := time.Now()
			r := row{cell: "ib_write_bw " + mode + " against rocev2d write-bw without -R: REJ", direction: "rocev2d server <- tool client (VM)", result: "FAIL"}
			defer func() { r.d = time.Since(t0); add(r) }()
			fail := func(format string, args ...any) {
				t.Helper()
				r.counters = strings.SplitN(fmt.Sprintf(format, args...), "\n", 2)[0]
				t.Fatalf(format, args...)
			}
			capt, err := lab.StartCapture(ctx, filepath.Join(lab.Dir, name+".pcap"))
			if err != nil {
				fail("capture: %v", err)
			}
			defer capt.Stop()
			h, err := lab.StartHost(ctx, img.Rocev2d, "write-bw", "--bind", HostIP, "-s", "4096", "-n", "100", "--timeout", "60s")
			if err != nil {
				fail("start: %v", err)
			}
			if err := h.WaitListen(ppPort, 20*time.Second); err != nil {
				h.Cmd.Process.Signal(os.Interrupt)
				_, out := h.Wait()
				fail("rocev2d server: %v\n%s", err, out)
			}
			vm, verr := lab.Run(ctx, fmt.Sprintf("ib_write_bw -d rxe0 -x %d -F %s -s 4096 -n 100 %s", lab.GIDIndex, mode, HostIP), 30*time.Second)
			h.Cmd.Process.Signal(os.Interrupt)
			_, hostOut := waitHost(h, 20*time.Second)
			switch {
			case verr != nil || vm.TimedOut:
				fail("ib_write_bw %s: %v, timed out %v (its CM REQ got no REJ)\n%s\nrocev2d:\n%s", mode, verr, vm.TimedOut, vm.Output, hostOut)
			case vm.Exit == 0 || !strings.Contains(vm.Output, "Unexpected CM event") || !strings.Contains(vm.Output, " 8\n"):
				fail("ib_write_bw %s: exit %d, want a failure on CM event 8 (REJECTED):\n%s", mode, vm.Exit, vm.Output)
			case strings.Contains(hostOut, "#bytes"):
				fail("rocev2d ran a test:\n%s", hostOut)
			}
			r.result, r.counters = "PASS", fmt.Sprintf("tool exit %d on the REJ: %s", vm.Exit, strings.TrimSpace(strings.SplitN(vm.Output, "\n", 2)[0]))
		})
	}
}

// perftest flags beyond the basic cells, both roles (perf27's sweep):
// ib_write_bw --report_gbits (perftest's Gb/sec columns on both sides),
// ib_write_bw -D 2 (duration mode: the row's iterations are what ran) and
// send-lat -e on rocev2d's side (it sleeps for its completions instead of
// polling). The tool runs that cell without -e: ib_send_lat -e on rxe 6.1
// stalled in a CI run in both roles — the capture shows the VM
// acknowledging rocev2d's SEND and never posting its next one, its
// completion event missed (the perf27 sweep had passed it). Every check
// of a clean cell applies (runCell).
func perfFlagCells(gidIndex int) []cell {
	var cs []cell
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, pt := range []struct {
			name, tool, sub string
			args            []string
			oursOnly        []string // given to rocev2d only
			check           func(who, out string) []string
			minPkts         int
			captureCheck    func(st *CaptureStats, hostOut, vmOut string) []string
		}{
			{"gbits", "ib_write_bw", "write-bw", []string{"--report_gbits", "-s", "4096", "-n", "200"}, nil, func(who, out string) []string {
				p := checkPerftestOutput(who, out, 4096, 200)
				if !strings.Contains(out, " BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n") {
					p = append(p, who+": no Gb/sec column header")
				}
				return p
			}, 200, nil},
			{"D2", "ib_write_bw", "write-bw", []string{"-D", "2", "-s", "4096"}, nil, checkDurationOutput(4096), 5, nil},
			// -Q and -l: both headers print perftest's CQ moderation (and
			// post list), the rows count every iteration.
			{"Q10", "ib_write_bw", "write-bw", []string{"-Q", "10", "-s", "4096", "-n", "200"}, nil,
				checkHeaderLines(4096, 200, " CQ Moderation   : 10\n"), 200, nil},
			{"l4", "ib_send_bw", "send-bw", []string{"-l", "4", "-s", "4096", "-n", "200"}, nil,
				checkHeaderLines(4096, 200, "                    Send Post List BW Test\n", " Post List       : 4\n",
					" CQ Moderation   : 4\n", "Post List requested - CQ moderation will be the size of the post list\n"), 200, nil},
			// --tclass 104 on both sides: every RoCEv2 packet of both,
			// the data and the ACKs, has DSCP 26 (rxe puts the GRH
			// traffic class in the IP TOS; so does rocev2d).
			{"tclass", "ib_write_bw", "write-bw", []string{"--tclass", "104", "-s", "4096", "-n", "200"}, nil,
				func(who, out string) []string { return checkPerftestOutput(who, out, 4096, 200) }, 200, checkAllDSCP(26)},
			// --use-srq: both sides' receives from an SRQ.
			{"srq", "ib_send_bw", "send-bw", []string{"--use-srq", "-s", "4096", "-n", "200"}, nil,
				checkHeaderLines(4096, 200, "Using SRQ      : ON\n"), 200, nil},
			{"e", "ib_send_lat", "send-lat", []string{"-s", "64", "-n", "100"}, []string{"-e"}, func(who, out string) []string {
				return checkPerftestOutput(who, out, 64, 100)
			}, 200, nil},
		} {
			cs = append(cs, cell{
				name:          fmt.Sprintf("%s_%s_rocev2d_%s", pt.tool, pt.name, role),
				label:         strings.Join(append(append([]string{pt.tool}, pt.args...), pt.oursOnly...), " "),
				tool:          fmt.Sprintf("%s -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(pt.args, " ")),
				toolName:      pt.tool,
				ours:          append(append([]string{pt.sub, "--bind", HostIP, "-v", "--timeout", "60s"}, pt.args...), pt.oursOnly...),
				check:         pt.check,
				rocev2dServer: server,
				minPkts:       pt.minPkts,
				captureCheck:  pt.captureCheck,
			})
		}
	}
	return cs
}

// checkAllDSCP checks that both sides sent RoCEv2 packets, all with DSCP
// dscp.
func checkAllDSCP(dscp int) func(st *CaptureStats, hostOut, vmOut string) []string {
	return func(st *CaptureStats, hostOut, vmOut string) []string {
		var p []string
		for _, side := range []string{"host", "vm"} {
			if st.DSCP[fmt.Sprintf("%s %d", side, dscp)] == 0 {
				p = append(p, fmt.Sprintf("no %s packet with DSCP %d (DSCP counts %v)", side, dscp, st.DSCP))
			}
		}
		for k, n := range st.DSCP {
			if !strings.HasSuffix(k, fmt.Sprintf(" %d", dscp)) {
				p = append(p, fmt.Sprintf("%d packets %s, want DSCP %d only", n, k, dscp))
			}
		}
		return p
	}
}

// checkHeaderLines checks a result row of size bytes and iters
// iterations and that the output holds each of lines.
func checkHeaderLines(size, iters int, lines ...string) func(who, out string) []string {
	return func(who, out string) []string {
		p := checkPerftestOutput(who, out, size, iters)
		for _, l := range lines {
			if !strings.Contains(out, l) {
				p = append(p, fmt.Sprintf("%s: no %q", who, strings.TrimSpace(l)))
			}
		}
		return p
	}
}

// checkDurationOutput checks a -D result row: size bytes and at least 5
// iterations (what ran in the duration, not -n).
func checkDurationOutput(size int) func(who, out string) []string {
	return func(who, out string) []string {
		lines := strings.Split(out, "\n")
		for i, l := range lines {
			if !rePerfHeader.MatchString(l) {
				continue
			}
			for _, row := range lines[i+1:] {
				m := rePerfRow.FindStringSubmatch(row)
				if m == nil {
					continue
				}
				if n, _ := strconv.Atoi(m[2]); m[1] != strconv.Itoa(size) || n < 5 {
					return []string{fmt.Sprintf("%s: result row %q, want %d bytes and at least 5 iterations", who, strings.TrimSpace(row), size)}
				}
				return nil
			}
		}
		return []string{who + ": no result table (#bytes #iterations ...)"}
	}
}
