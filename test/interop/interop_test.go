package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

const enableHint = "the interop suite (rocev2d against Linux rdma_rxe in a qemu VM) is off; " +
	"enable it with ROCEV2_INTEROP=1 (needs root; installs qemu, rdma-core, perftest and a Debian " +
	"kernel into $ROCEV2_INTEROP_CACHE, default /tmp/rocev2-interop; ~2 min on 2 cores, see test/interop/README.md)"

// ppPort is the out-of-band TCP port of ibv_rc_pingpong.
const ppPort = 18515

// badCounters are rxe hw_counters that must not move on a clean run.
var badCounters = []string{
	"out_of_seq_request", "rcvd_seq_err", "retry_exceeded_err", "retry_rnr_exceeded_err",
	"rcvd_rnr_err", "send_rnr_err", "send_err",
}

// retryCounters count retransmissions: completer_retry_err (rxe resent)
// and duplicate_request (rxe received a resent request). rxe 6.1 arms its
// 67 ms retransmit timer at the first packet after the previous expiry and
// does not restart it when ACKs arrive, so the timer expires every ~67 ms
// of traffic; an expiry that falls while a message of rxe is still in
// flight resends it although nothing was lost (rxe's own comment: "we
// still might get spurious timeouts"). A few per cell are therefore
// tolerated (flagged in the table) unless ROCEV2_INTEROP_STRICT=1.
var retryCounters = []string{"completer_retry_err", "duplicate_request"}

// maxRetries is how many retransmissions a cell tolerates.
func maxRetries() int64 {
	if os.Getenv("ROCEV2_INTEROP_STRICT") == "1" {
		return 0
	}
	return 3
}

// row is one line of the result table.
type row struct {
	cell, direction, result, packets, counters string
	d                                          time.Duration
}

func iters() int {
	if s := os.Getenv("ROCEV2_INTEROP_ITERS"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 {
			return n
		}
	}
	return 100
}

// TestInterop prepares the lab, boots one VM with rxe0 and runs the matrix
// of rocev2d against the real tools in the VM, in both roles.
func TestInterop(t *testing.T) {
	if os.Getenv("ROCEV2_INTEROP") != "1" {
		t.Skip(enableHint)
	}
	if testing.Short() {
		t.Skip("the interop suite does not run in -short mode (it boots a VM); run it without -short")
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("ROCEV2_INTEROP=1 needs root (network namespace, tap, apt-get)")
		}
		t.Skip("ROCEV2_INTEROP=1 needs root (network namespace, tap, apt-get)")
	}
	t0 := time.Now()
	root, err := FindRepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	cache := DefaultCacheDir()
	img, err := Prepare(Config{CacheDir: cache, RepoRoot: root, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	setup := time.Since(t0)
	runDir := filepath.Join(cache, "run")
	os.RemoveAll(runDir)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	lab, err := StartLab(ctx, img, runDir, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lab.Close)
	t.Logf("lab: setup %.1fs, boot %.1fs, kernel %s, rxe0 GID index %d, run dir %s",
		setup.Seconds(), lab.BootTime.Seconds(), img.KernelVersion, lab.GIDIndex, runDir)

	var rows []row
	defer func() {
		printTable(t, rows, img, setup, lab.BootTime, time.Since(t0))
	}()
	for _, c := range append(cells(lab.GIDIndex), lossCells(lab.GIDIndex)...) {
		t.Run(c.name, func(t *testing.T) {
			rows = append(rows, runCell(t, ctx, lab, img, c))
		})
	}
}

// cell is one entry of the matrix: rocev2d against a real tool in the VM.
type cell struct {
	name, label   string
	tool          string   // command in the VM, without the server address
	toolName      string   // for messages
	ours          []string // rocev2d arguments, without the server address
	rocev2dServer bool
	// check inspects an output (rocev2d's or the tool's) and returns problems.
	check func(who, out string) []string
	// passiveServer: the server side prints no result (ib_read_lat).
	passiveServer bool
	// port is the tool's TCP port (default 18515).
	port int
	// inproc, when set, runs the rocev2 side in this process (inside the
	// lab namespace) instead of the rocev2d binary; as a server it reports
	// on ready once it listens. It returns an exit status and its output.
	inproc   func(ctx context.Context, lab *Lab, ready chan<- error) (int, string)
	minPkts  int // RoCEv2 packets the capture must hold at least
	wantPkts int // what a loss-free run sends (0: not known), for the table
	// loss, when > 0, drops RoCEv2 packets at random in both directions
	// on the tap (eBPF injector, loss_test.go): sequence errors and
	// retransmissions are then expected and reported, not failures.
	loss float64
}

// cells returns the matrix: every test with rocev2d as server and as client.
func cells(gidIndex int) []cell {
	var cs []cell
	n := iters()
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		for _, size := range []int{64, 4096} {
			perMsg := (size + 1023) / 1024
			cs = append(cs, cell{
				name:          fmt.Sprintf("rc_pingpong_%d_rocev2d_%s", size, role),
				label:         fmt.Sprintf("ibv_rc_pingpong -s %d -n %d -c", size, n),
				tool:          fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -n %d -s %d", gidIndex, n, size),
				toolName:      "ibv_rc_pingpong",
				ours:          []string{"pingpong", "--bind", HostIP, "-s", strconv.Itoa(size), "-n", strconv.Itoa(n), "--timeout", "120s"},
				check:         func(who, out string) []string { return checkPingpongOutput(who, out, size, n) },
				rocev2dServer: server,
				minPkts:       2 * n * perMsg,
				wantPkts:      2 * n * (perMsg + 1),
			})
		}
		for _, pt := range []struct {
			tool, sub string
			size, n   int
			extra     []string
			pkts      int // requests+responses per iteration
		}{
			{"ib_send_bw", "send-bw", 4096, 2 * n, nil, 5},
			{"ib_write_bw", "write-bw", 4096, 2 * n, nil, 5},
			{"ib_read_bw", "read-bw", 4096, 2 * n, nil, 5},
			{"ib_atomic_bw", "atomic-bw", 8, 2 * n, []string{"-A", "CMP_AND_SWAP"}, 2},
			{"ib_atomic_bw", "atomic-bw", 8, 2 * n, []string{"-A", "FETCH_AND_ADD"}, 2},
			{"ib_write_lat", "write-lat", 64, n, nil, 2},
			{"ib_read_lat", "read-lat", 64, n, nil, 2},
		} {
			args := []string{"-s", strconv.Itoa(pt.size), "-n", strconv.Itoa(pt.n)}
			args = append(args, pt.extra...)
			name := fmt.Sprintf("%s_%d%s_rocev2d_%s", pt.tool, pt.size, strings.ToLower(strings.Join(pt.extra, "")), role)
			name = strings.ReplaceAll(strings.ReplaceAll(name, "-a", "_"), " ", "")
			size, iters := pt.size, pt.n
			cs = append(cs, cell{
				name:     name,
				label:    strings.Join(append([]string{pt.tool}, args...), " "),
				tool:     fmt.Sprintf("%s -d rxe0 -x %d -F %s", pt.tool, gidIndex, strings.Join(args, " ")),
				toolName: pt.tool,
				ours:     append([]string{pt.sub, "--bind", HostIP, "--timeout", "120s"}, args...),
				check: func(who, out string) []string {
					return checkPerftestOutput(who, out, size, iters)
				},
				rocev2dServer: server,
				passiveServer: pt.tool == "ib_read_lat",
				minPkts:       iters,
			})
		}
		for _, op := range []string{"write", "send"} {
			for _, size := range []int{64, 4096} {
				op, size, iters := op, size, n/2
				wr := map[string]string{"write": "RDMA_WRITE_WITH_IMM", "send": "SEND_WITH_IMM"}[op]
				cs = append(cs, cell{
					name:     fmt.Sprintf("%s_imm_%d_rocev2d_%s", op, size, role),
					label:    fmt.Sprintf("rv2imm -o %s -s %d -n %d", op, size, iters),
					tool:     fmt.Sprintf("rv2imm -d rxe0 -g %d -o %s -s %d -n %d", gidIndex, op, size, iters),
					toolName: "rv2imm",
					port:     immPort,
					inproc: func(ctx context.Context, lab *Lab, ready chan<- error) (int, string) {
						var out strings.Builder
						err := runImm(ctx, lab, immConfig{write: op == "write", size: size, iters: iters, requester: !server}, &out, ready)
						if err != nil {
							fmt.Fprintf(&out, "error: %v\n", err)
							return 1, out.String()
						}
						return 0, out.String()
					},
					check: func(who, out string) []string {
						want := fmt.Sprintf("%d %s of %d bytes", iters, wr, size)
						if !strings.Contains(out, want) {
							return []string{fmt.Sprintf("%s: no %q line", who, want)}
						}
						return nil
					},
					rocev2dServer: server,
					minPkts:       2 * iters,
					wantPkts:      iters * ((size+1023)/1024 + 1),
				})
			}
		}
	}
	return cs
}

// runCell runs rocev2d against the real tool in the VM.
func runCell(t *testing.T, ctx context.Context, lab *Lab, img *Image, c cell) row {
	t0 := time.Now()
	name := c.name
	r := row{cell: c.label, result: "FAIL"}
	ibv := c.tool
	ours := c.ours
	before, err := lab.Counters(ctx)
	if err != nil {
		t.Fatalf("counters: %v", err)
	}
	var inj *lossInjector
	if c.loss > 0 {
		if inj, err = attachLoss(lab, c.loss); err != nil {
			t.Fatalf("fault injector: %v", err)
		}
		defer inj.close()
	}
	pcapFile := filepath.Join(lab.Dir, name+".pcap")
	capt, err := lab.StartCapture(ctx, pcapFile)
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
	var hostCode int
	var hostOut string
	var vm agentproto.Response
	var vmErr error
	port := c.port
	if port == 0 {
		port = ppPort
	}
	switch {
	case c.rocev2dServer && c.inproc != nil:
		r.direction = "rocev2d server <- tool client (VM)"
		ready := make(chan error, 1)
		done := make(chan struct{})
		go func() {
			defer close(done)
			hostCode, hostOut = c.inproc(ctx, lab, ready)
		}()
		if err := <-ready; err != nil {
			<-done
			capt.Stop()
			t.Fatalf("rocev2d server: %v\n%s", err, hostOut)
		}
		vm, vmErr = lab.Run(ctx, ibv+" "+HostIP, 150*time.Second)
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			t.Fatalf("in-process rocev2d side did not finish 90 s after the VM side")
		}
	case c.rocev2dServer:
		r.direction = "rocev2d server <- tool client (VM)"
		h, err := lab.StartHost(ctx, img.Rocev2d, ours...)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.WaitListen(port, 20*time.Second); err != nil {
			h.Cmd.Process.Signal(os.Interrupt)
			_, out := h.Wait()
			capt.Stop()
			t.Fatalf("rocev2d server: %v\n%s", err, out)
		}
		vm, vmErr = lab.Run(ctx, ibv+" "+HostIP, 150*time.Second)
		hostCode, hostOut = waitHost(h, 20*time.Second)
	default:
		r.direction = "rocev2d client -> tool server (VM)"
		v, err := lab.StartVM(ctx, agentproto.Request{Cmd: ibv, TimeoutSec: 150})
		if err != nil {
			t.Fatal(err)
		}
		if err := lab.WaitListenVM(ctx, port, 20*time.Second); err != nil {
			out, _ := v.Cancel()
			capt.Stop()
			t.Fatalf("%s server in the VM: %v\n%s", c.toolName, err, out.Output)
		}
		if c.inproc != nil {
			hostCode, hostOut = c.inproc(ctx, lab, make(chan error, 1))
		} else {
			h, err := lab.StartHost(ctx, img.Rocev2d, append(ours, VMIP)...)
			if err != nil {
				t.Fatal(err)
			}
			hostCode, hostOut = waitHost(h, 150*time.Second)
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		vm, vmErr = v.Wait(wctx)
		cancel()
		if vmErr != nil {
			vm, _ = v.Cancel()
		}
	}
	tcpdumpSummary := capt.Stop()
	after, cerr := lab.Counters(ctx)
	r.d = time.Since(t0)

	// Checks.
	var problems []string
	if hostCode != 0 {
		problems = append(problems, fmt.Sprintf("rocev2d exit status %d", hostCode))
	}
	if vmErr != nil || vm.Exit != 0 {
		problems = append(problems, fmt.Sprintf("%s exit status %d %v %s", c.toolName, vm.Exit, vmErr, vm.Err))
	}
	if !c.passiveServer || !c.rocev2dServer {
		problems = append(problems, c.check("rocev2d", hostOut)...)
	}
	if !c.passiveServer || c.rocev2dServer {
		problems = append(problems, c.check(c.toolName, vm.Output)...)
	}

	// The capture: our analysis, and rocev2d pcap check.
	st, aerr := AnalyzeCapture(pcapFile)
	if aerr != nil {
		problems = append(problems, "capture: "+aerr.Error())
		st = &CaptureStats{}
	}
	r.packets = fmt.Sprintf("%d (%d>vm %d<vm)", st.RoCE, st.FromHost, st.FromVM)
	if c.wantPkts > 0 {
		r.packets = fmt.Sprintf("%d (%d>vm %d<vm, want %d)", st.RoCE, st.FromHost, st.FromVM, c.wantPkts)
	}
	if st.RoCE < c.minPkts {
		problems = append(problems, fmt.Sprintf("capture has %d RoCEv2 packets, want at least %d", st.RoCE, c.minPkts))
	}
	if st.BadICRC > 0 || st.Bad > 0 {
		problems = append(problems, fmt.Sprintf("capture: %d bad ICRC, %d malformed", st.BadICRC, st.Bad))
	}
	chk, chkErr := exec.CommandContext(ctx, img.Rocev2d, "pcap", "check", "-q", pcapFile).CombinedOutput()
	if chkErr != nil {
		problems = append(problems, fmt.Sprintf("rocev2d pcap check: %v", chkErr))
	}

	if msg := tsharkCheck(ctx, pcapFile); msg != "" {
		problems = append(problems, msg)
	}

	// rxe counters.
	var cnt []string
	flagged := false
	if cerr != nil {
		problems = append(problems, "counters: "+cerr.Error())
	} else {
		delta := func(k string) int64 { return int64(after[k]) - int64(before[k]) }
		cnt = append(cnt, fmt.Sprintf("rcvd=%d sent=%d", delta("rcvd_pkts"), delta("sent_pkts")))
		for _, k := range badCounters {
			if d := delta(k); d != 0 {
				cnt = append(cnt, fmt.Sprintf("%s=%d", k, d))
				if c.loss == 0 || !lossExpected[k] {
					problems = append(problems, fmt.Sprintf("rxe counter %s moved by %d", k, d))
				}
			}
		}
		// Every packet rocev2d sent must have been accepted by rxe (it drops
		// a bad ICRC silently), and the capture must hold all of rxe's.
		if drops := reDropped.FindStringSubmatch(tcpdumpSummary); drops != nil && drops[1] != "0" {
			problems = append(problems, "tcpdump dropped packets: "+drops[0])
		}
		if got, sent := int64(st.FromVM), delta("sent_pkts"); got != sent {
			problems = append(problems, fmt.Sprintf("capture holds %d packets from rxe, rxe counted %d sent", got, sent))
		}
		if got, acc := int64(st.FromHost), delta("rcvd_pkts"); got != acc {
			problems = append(problems, fmt.Sprintf("rxe accepted %d of the %d packets rocev2d sent (rcvd_pkts)", acc, got))
		}
		var retries int64
		for _, k := range retryCounters {
			if d := delta(k); d != 0 {
				cnt = append(cnt, fmt.Sprintf("%s=%d", k, d))
				retries += d
			}
		}
		if inj != nil {
			cnt = append(cnt, inj.summary(hostOut))
			problems = append(problems, inj.problems(retries, hostOut)...)
		} else if retries > maxRetries() {
			problems = append(problems, fmt.Sprintf("%d retransmissions (rxe counters %v), more than the %d tolerated", retries, retryCounters, maxRetries()))
		} else if retries > 0 {
			flagged = true
		}
	}
	r.counters = strings.Join(cnt, " ")
	if len(problems) == 0 {
		r.result = "PASS"
		if flagged {
			r.result = "PASS*"
		}
		t.Logf("%s: %s in %.1fs\n--- rocev2d:\n%s--- %s:\n%s", name, r.direction, r.d.Seconds(),
			resultLines(hostOut), c.toolName, resultLines(vm.Output))
		return r
	}
	t.Errorf("%s (%s) failed:\n- %s\n--- rocev2d output:\n%s\n--- %s output (VM):\n%s\n--- capture %s: %s\n%s--- rocev2d pcap check -q:\n%s\n--- rxe counters after: %v\n--- VM console (last 20 lines):\n%s",
		name, r.direction, strings.Join(problems, "\n- "), hostOut, c.toolName, vm.Output, pcapFile, tcpdumpSummary,
		st, tail(string(chk), 30), after, lab.Console(20))
	return r
}

// tsharkCheck decodes the capture with tshark (when installed) and reports
// malformed frames or error-level expert infos.
func tsharkCheck(ctx context.Context, file string) string {
	if _, err := exec.LookPath("tshark"); err != nil {
		return ""
	}
	out, err := exec.CommandContext(ctx, "tshark", "-n", "-r", file, "-Y", `_ws.malformed || _ws.expert.severity >= "Error"`,
		"-T", "fields", "-e", "frame.number", "-e", "_ws.expert.message").Output()
	if err != nil {
		return fmt.Sprintf("tshark -r %s: %v", file, err)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return "tshark: malformed or error frames:\n" + tail(s, 20)
	}
	return ""
}

// waitHost waits up to d for a host program, then interrupts it.
func waitHost(h *HostProc, d time.Duration) (int, string) {
	select {
	case <-h.Done():
	case <-time.After(d):
		h.Cmd.Process.Signal(os.Interrupt)
	}
	return h.Wait()
}

var (
	reBytesLine = regexp.MustCompile(`(?m)^(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec`)
	reItersLine = regexp.MustCompile(`(?m)^(\d+) iters in ([0-9.]+) seconds = ([0-9.]+) usec/iter`)
)

// checkPingpongOutput checks the two result lines of a pingpong.
func checkPingpongOutput(who, out string, size, n int) []string {
	var p []string
	mb := reBytesLine.FindStringSubmatch(out)
	mi := reItersLine.FindStringSubmatch(out)
	if mb == nil || mi == nil {
		return []string{who + ": no result lines"}
	}
	if strings.Contains(out, "invalid data") || strings.Contains(out, "validation failed") {
		p = append(p, who+": -c found invalid data")
	}
	if want := strconv.Itoa(2 * size * n); mb[1] != want {
		p = append(p, fmt.Sprintf("%s: %s bytes, want %s", who, mb[1], want))
	}
	if want := strconv.Itoa(n); mi[1] != want {
		p = append(p, fmt.Sprintf("%s: %s iters, want %s", who, mi[1], want))
	}
	return p
}

// resultLines returns the result lines of a pingpong or perftest output.
func resultLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		if reItersLine.MatchString(l) || reBytesLine.MatchString(l) || rePerfHeader.MatchString(l) || rePerfRow.MatchString(l) {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

var reDropped = regexp.MustCompile(`(\d+) packets? dropped by kernel`)

var (
	rePerfHeader = regexp.MustCompile(`^\s*#bytes\s+#iterations`)
	rePerfRow    = regexp.MustCompile(`^\s*(\d+)\s+(\d+)\s+[0-9.]+`)
)

// checkPerftestOutput checks a perftest result table: a "#bytes
// #iterations ..." header followed by a row for size and iters.
func checkPerftestOutput(who, out string, size, iters int) []string {
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
			if m[1] != strconv.Itoa(size) || m[2] != strconv.Itoa(iters) {
				return []string{fmt.Sprintf("%s: result row %q, want %d bytes, %d iterations", who, strings.TrimSpace(row), size, iters)}
			}
			return nil
		}
	}
	return []string{who + ": no result table (#bytes #iterations ...)"}
}

// printTable prints the result table and the timings (also to
// run/results.txt in the cache).
func printTable(t *testing.T, rows []row, img *Image, setup, boot, total time.Duration) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-42s %-36s %-6s %7s  %-34s %s\n", "cell", "direction", "result", "time", "packets", "rxe counters (delta)")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-42s %-36s %-6s %6.1fs  %-34s %s\n", r.cell, r.direction, r.result, r.d.Seconds(), r.packets, r.counters)
	}
	var steps []string
	for _, s := range img.Timings {
		steps = append(steps, fmt.Sprintf("%s %.1fs", s.Step, s.D.Seconds()))
	}
	fmt.Fprintf(&b, "PASS* = passed with a few retransmissions (rxe's free-running 67 ms retransmit timer; ROCEV2_INTEROP_STRICT=1 fails them)\n")
	fmt.Fprintf(&b, "timings: setup %.1fs (%s), boot %.1fs, total %.1fs\n", setup.Seconds(), strings.Join(steps, ", "), boot.Seconds(), total.Seconds())
	fmt.Print(b.String())
	t.Log(b.String())
	os.WriteFile(filepath.Join(DefaultCacheDir(), "run", "results.txt"), []byte(b.String()), 0o644)
}
