//go:build linux

package interop

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

func init() { labSuites = append(labSuites, perfInfSuite) }

// reInfRow is a --run_infinitely period row: size, iterations, peak
// (perftest's noPeak: 0.00), average, message rate.
var reInfRow = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)

// infRows returns out's period rows of size bytes and what is wrong with
// them: each has peak 0.00, and the periods moved something.
func infRows(who, out string, size int) (int, []string) {
	var probs []string
	rows, total := 0, 0
	for _, m := range reInfRow.FindAllStringSubmatch(out, -1) {
		rows++
		var n int
		fmt.Sscan(m[2], &n)
		total += n
		if m[1] != fmt.Sprint(size) || m[3] != "0.00" {
			probs = append(probs, fmt.Sprintf("%s: row %q, want %d bytes and peak 0.00", who, strings.TrimSpace(m[0]), size))
		}
	}
	if rows > 0 && total == 0 {
		probs = append(probs, who+": no iteration in any period")
	}
	return rows, probs
}

// perfInfSuite: --run_infinitely -D 1 against perftest 4.5's, both roles,
// write_bw and send_bw, interrupted (SIGINT) after two periods. Each side
// that runs traffic prints a row per second with peak 0.00; perftest prints
// nothing more at SIGINT, and neither does rocev2d (exit 0). A rocev2d
// server whose client was interrupted ends by itself (exit 0, saying the
// peer closed the connection); perftest's write_bw server ends on the
// closed connection, its send_bw server never does (it is cancelled).
func perfInfSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	const size = 4096
	for _, tc := range []struct{ tool, sub string }{{"ib_write_bw", "write-bw"}, {"ib_send_bw", "send-bw"}} {
		toolCmd := fmt.Sprintf("%s -d rxe0 -x %d -F --run_infinitely -D 1 -s %d", tc.tool, lab.GIDIndex, size)
		ours := []string{tc.sub, "--bind", HostIP, "--run_infinitely", "-D", "1", "-s", fmt.Sprint(size), "--timeout", "90s"}
		sendServer := tc.sub == "send-bw"
		for _, ourServer := range []bool{true, false} {
			role := map[bool]string{true: "server", false: "client"}[ourServer]
			name := fmt.Sprintf("%s_run_infinitely_rocev2d_%s", tc.tool, role)
			t.Run(name, func(t *testing.T) {
				t0 := time.Now()
				dir := "rocev2d client -> tool server (VM)"
				if ourServer {
					dir = "rocev2d server <- tool client (VM)"
				}
				r := row{cell: tc.tool + " --run_infinitely -D 1 -s 4096, SIGINT after >= 2 periods", direction: dir, result: "FAIL"}
				defer func() { r.d = time.Since(t0); add(r) }()
				fail := func(format string, args ...any) {
					t.Helper()
					r.counters = strings.SplitN(fmt.Sprintf(format, args...), "\n", 2)[0]
					t.Fatalf(format, args...)
				}
				before, err := lab.Counters(ctx)
				if err != nil {
					fail("rxe counters: %v", err)
				}
				var probs []string
				var hostOut, vmOut string
				var hostRows, vmRows int
				if ourServer {
					h, err := lab.StartHost(ctx, img.Rocev2d, ours...)
					if err != nil {
						fail("start: %v", err)
					}
					if err := h.WaitListen(ppPort, 20*time.Second); err != nil {
						h.Cmd.Process.Signal(os.Interrupt)
						_, out := h.Wait()
						fail("rocev2d server: %v\n%s", err, out)
					}
					// The tool's client, interrupted after about four
					// periods (busybox timeout: a background job of the
					// agent's sh would ignore SIGINT).
					vm, verr := lab.Run(ctx, fmt.Sprintf(`timeout -s INT 6 %s %s; echo "tool exit $?"`, toolCmd, HostIP), 40*time.Second)
					vmOut = vm.Output
					if verr != nil || vm.TimedOut {
						probs = append(probs, fmt.Sprintf("tool: %v, timed out %v", verr, vm.TimedOut))
					}
					// The server ends by itself: the client has gone.
					code, out := waitHost(h, 20*time.Second)
					hostOut = out
					if code != 0 || !strings.Contains(out, "the peer closed the out-of-band connection") {
						probs = append(probs, fmt.Sprintf("rocev2d server: exit %d, want 0 saying the peer closed the connection", code))
					}
				} else {
					v, err := lab.StartVM(ctx, agentproto.Request{Cmd: toolCmd, TimeoutSec: 60})
					if err != nil {
						fail("start tool: %v", err)
					}
					if err := lab.WaitListenVM(ctx, ppPort, 20*time.Second); err != nil {
						out, _ := v.Cancel()
						fail("tool server: %v\n%s", err, out.Output)
					}
					h, err := lab.StartHost(ctx, img.Rocev2d, append(ours, VMIP)...)
					if err != nil {
						v.Cancel()
						fail("start: %v", err)
					}
					for i := 0; i < 300; i++ {
						if n, _ := infRows("", h.Output(), size); n >= 2 {
							break
						}
						select {
						case <-h.Done():
						case <-time.After(100 * time.Millisecond):
							continue
						}
						break
					}
					h.Cmd.Process.Signal(os.Interrupt)
					code, out := waitHost(h, 20*time.Second)
					hostOut = out
					if code != 0 {
						probs = append(probs, fmt.Sprintf("rocev2d client: exit %d after SIGINT, want 0", code))
					}
					if sendServer {
						// perftest's send_bw server polls forever; it has
						// printed its periods by now.
						time.Sleep(1500 * time.Millisecond)
						vm, _ := v.Cancel()
						vmOut = vm.Output
					} else {
						wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						vm, err := v.Wait(wctx)
						cancel()
						vmOut = vm.Output
						if err != nil {
							probs = append(probs, fmt.Sprintf("tool server did not end after the client's SIGINT: %v", err))
						}
					}
				}
				t.Logf("rocev2d:\n%s\n%s:\n%s", hostOut, tc.tool, vmOut)
				var p []string
				hostRows, p = infRows("rocev2d", hostOut, size)
				probs = append(probs, p...)
				// perftest's own rows are shown, not required: its stdout
				// is a pipe here, fully buffered, and the SIGINT or the
				// agent's SIGKILL ends it with what it holds unwritten.
				vmRows, _ = infRows(tc.tool, vmOut, size)
				hostWant := 2
				if ourServer && !sendServer {
					hostWant = 0 // a passive server prints no period
				}
				if (hostWant == 0) != (hostRows == 0) || hostRows < hostWant {
					probs = append(probs, fmt.Sprintf("rocev2d printed %d period rows, want %s", hostRows, map[bool]string{true: "none", false: "at least 2"}[hostWant == 0]))
				}
				after, err := lab.Counters(ctx)
				if err != nil {
					fail("rxe counters: %v", err)
				}
				rcvd := after["rcvd_pkts"] - before["rcvd_pkts"]
				sent := after["sent_pkts"] - before["sent_pkts"]
				if rcvd == 0 || sent == 0 {
					probs = append(probs, fmt.Sprintf("rxe sent %d and received %d packets", sent, rcvd))
				}
				if len(probs) > 0 {
					fail("%s\nrocev2d:\n%s\n%s:\n%s", strings.Join(probs, "\n"), hostOut, tc.tool, vmOut)
				}
				r.result = "PASS"
				r.packets = fmt.Sprintf("rxe sent %d, rcvd %d", sent, rcvd)
				r.counters = fmt.Sprintf("rows: rocev2d %d, tool %d", hostRows, vmRows)
			})
		}
	}
}
