//go:build linux

package interop

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
	"github.com/gorocev2/rocev2/udp/share"
)

// The sharing cell (issue 28): three rocev2d servers — rping, ib_write_bw
// -R and ibv_rc_pingpong — as three processes on the host's one lab
// address (UDP 4791 shared, --share), the VM running the three clients
// concurrently against them; every data check passes (rping -V, the
// pingpongs' -c on both sides, the perftest results). Then, with the
// clients of rping and ib_write_bw running again, the pingpong server is
// killed with SIGKILL and started again: the other two pass unaffected and
// the restarted one serves a new ibv_rc_pingpong client.

func init() { labSuites = append(labSuites, shareSuite) }

// sharePPPort is the out-of-band TCP port of the pingpong server (rocev2d
// -R servers listen on TCP 18515 as well).
const sharePPPort = 18516

// shareServers starts the three rocev2d servers on HostIP.
func shareServers(ctx context.Context, lab *Lab, img *Image, rpingSize, bwN, ppN int) (rp, bw, pp *HostProc, err error) {
	stop := func(hs ...*HostProc) {
		for _, h := range hs {
			if h != nil {
				h.Cmd.Process.Kill()
				h.Wait()
			}
		}
	}
	if rp, err = lab.StartHost(ctx, img.Rocev2d, "rping", "-s", "-a", HostIP, "-v", "-V", "-S", strconv.Itoa(rpingSize), "--share"); err != nil {
		return
	}
	if bw, err = lab.StartHost(ctx, img.Rocev2d, "write-bw", "-R", "--bind", HostIP, "-s", "4096", "-n", strconv.Itoa(bwN), "--share", "--timeout", "300s", "-u", "18"); err != nil {
		stop(rp)
		return
	}
	if pp, err = startSharePP(ctx, lab, img, ppN); err != nil {
		stop(rp, bw)
		return
	}
	for _, h := range []*HostProc{rp, bw} {
		if err = waitHostRoCE(h, 20*time.Second); err != nil {
			stop(rp, bw, pp)
			return
		}
	}
	if err = bw.WaitListen(perfCMPort, 20*time.Second); err != nil {
		stop(rp, bw, pp)
	}
	return
}

func startSharePP(ctx context.Context, lab *Lab, img *Image, n int) (*HostProc, error) {
	pp, err := lab.StartHost(ctx, img.Rocev2d, "pingpong", "--bind", HostIP, "-p", strconv.Itoa(sharePPPort), "-s", "4096",
		"-n", strconv.Itoa(n), "-c", "--share", "--timeout", "300s",
		// The TCG VM can stop for over a second on a loaded host (a
		// capture: 1.1 s without a packet from it, all QPs): the tool's
		// 67 ms × 7 retries ran out while the VM was stopped.
		"--qp-timeout", "18")
	if err != nil {
		return nil, err
	}
	if err := waitHostRoCE(pp, 20*time.Second); err != nil {
		pp.Cmd.Process.Kill()
		pp.Wait()
		return nil, err
	}
	if err := pp.WaitListen(sharePPPort, 20*time.Second); err != nil {
		pp.Cmd.Process.Kill()
		pp.Wait()
		return nil, err
	}
	return pp, nil
}

// shareClients is the VM's shell command running the clients given
// (rping, ib_write_bw, ibv_rc_pingpong; a zero count leaves one out)
// concurrently, printing each one's exit status and output.
// Each client's files are named after it and tag, so that a second
// command running while the first does never overwrites them.
func shareClients(tag string, gid, rpingSize, rpingCount, bwN, ppN int) string {
	var b strings.Builder
	type cl struct {
		name, cmd string
		timeout   int // seconds
	}
	var cls []cl
	if rpingCount > 0 {
		cls = append(cls, cl{"rping", fmt.Sprintf("rping -c -a %s -v -V -S %d -C %d", HostIP, rpingSize, rpingCount), 240})
	}
	if bwN > 0 {
		cls = append(cls, cl{"ib_write_bw", fmt.Sprintf("ib_write_bw -R -d rxe0 -x %d -F -s 4096 -n %d %s", gid, bwN, HostIP), 240})
	}
	if ppN > 0 {
		// 60 s: a client whose server the kill/restart cell killed waits
		// for the peer's SEND for ever; at 240 s it alone made that cell
		// four minutes long.
		cls = append(cls, cl{"ibv_rc_pingpong", fmt.Sprintf("ibv_rc_pingpong -d rxe0 -g %d -p %d -s 4096 -n %d -c %s", gid, sharePPPort, ppN, HostIP), 60})
	}
	for i, c := range cls {
		// timeout: a hung client still reports (exit 124) with its output.
		f := fmt.Sprintf("/tmp/share-%s-%d", tag, i)
		// f.tpid: the PID of timeout, which passes a SIGTERM on to
		// the client (the kill/restart cell ends the orphaned client so).
		fmt.Fprintf(&b, "(timeout %d %s >%s.out 2>%s.err & echo $! >%s.tpid; wait $!; echo $? >%s.rc) & ", c.timeout, c.cmd, f, f, f, f)
	}
	b.WriteString("wait; ")
	for i, c := range cls {
		f := fmt.Sprintf("/tmp/share-%s-%d", tag, i)
		fmt.Fprintf(&b, "echo \"=== %s exit $(cat %s.rc)\"; cat %s.out %s.err; ", c.name, f, f, f)
	}
	return b.String()
}

var reShareSection = regexp.MustCompile(`(?m)^=== (\S+) exit (-?\d+)$`)

// shareSections splits the VM output into each client's exit status and
// output.
func shareSections(out string) map[string]struct {
	exit int
	out  string
} {
	res := map[string]struct {
		exit int
		out  string
	}{}
	idx := reShareSection.FindAllStringSubmatchIndex(out, -1)
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		code, _ := strconv.Atoi(out[m[4]:m[5]])
		res[out[m[2]:m[3]]] = struct {
			exit int
			out  string
		}{code, out[m[1]:end]}
	}
	return res
}

// checkShareClient checks one client's exit status and output and its
// server's, by the tools' own data checks.
func checkShareClient(name string, vmExit int, vmOut string, hostExit int, hostOut string, count, size int) []string {
	var p []string
	if vmExit != 0 {
		p = append(p, fmt.Sprintf("%s (VM) exit %d", name, vmExit))
	}
	if hostExit != 0 {
		p = append(p, fmt.Sprintf("rocev2d %s server exit %d", name, hostExit))
	}
	switch name {
	case "rping":
		// As checkRpingOutputs, for any -S.
		p = append(p, checkPingLines("rping (client)", rePingLine, vmOut, count, size)...)
		p = append(p, checkPingLines("rocev2d rping (server)", reServerPingLine, hostOut, count, size)...)
		if !strings.Contains(hostOut, "server DISCONNECT EVENT...") {
			p = append(p, "rocev2d rping: no \"server DISCONNECT EVENT...\"")
		}
		for _, bad := range []string{"data mismatch", "failed", "error"} {
			if strings.Contains(vmOut, bad) || strings.Contains(hostOut, bad) {
				p = append(p, fmt.Sprintf("an rping output says %q", bad))
			}
		}
	case "ib_write_bw":
		p = append(p, checkPerftestOutput("ib_write_bw", vmOut, 4096, count)...)
		p = append(p, checkPerftestOutput("rocev2d write-bw", hostOut, 4096, count)...)
	case "ibv_rc_pingpong":
		p = append(p, checkPingpongOutput("ibv_rc_pingpong", vmOut, 4096, count)...)
		p = append(p, checkPingpongOutput("rocev2d pingpong", hostOut, 4096, count)...)
	}
	return p
}

func shareSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	t.Run("share_three_servers_one_address", func(t *testing.T) {
		t0 := time.Now()
		r := row{cell: "rping + ib_write_bw -R + ibv_rc_pingpong servers sharing 192.0.2.1:4791", direction: "3 rocev2d servers <- 3 tool clients (VM)", result: "FAIL"}
		defer func() { r.d = time.Since(t0); add(r) }()
		const rpN, rpS, bwN, ppN = 50, rpingSize, 2000, 200
		rp, bw, pp, err := shareServers(ctx, lab, img, rpS, bwN, ppN)
		if err != nil {
			t.Fatalf("servers: %v", err)
		}
		vm, err := lab.Run(ctx, shareClients("a", lab.GIDIndex, rpS, rpN, bwN, ppN), 260*time.Second)
		t.Logf("VM clients: exit %d err %v, output (last lines):\n%s", vm.Exit, err, lastLines(vm.Output, 40))
		if err != nil {
			for _, h := range []*HostProc{rp, bw, pp} {
				h.Cmd.Process.Signal(syscall.SIGTERM)
				_, out := h.Wait()
				t.Logf("host %s:\n%s", h.Cmd.Args[1], lastLines(out, 20))
			}
			t.Fatalf("VM clients: %v", err)
		}
		secs := shareSections(vm.Output)
		var probs []string
		for _, c := range []struct {
			name string
			h    *HostProc
			n    int
		}{{"rping", rp, rpN}, {"ib_write_bw", bw, bwN}, {"ibv_rc_pingpong", pp, ppN}} {
			code, out := waitHost(c.h, 30*time.Second)
			s, ok := secs[c.name]
			if !ok {
				probs = append(probs, c.name+": no output from the VM")
				continue
			}
			probs = append(probs, checkShareClient(c.name, s.exit, s.out, code, out, c.n, rpS)...)
			t.Logf("%s: host exit %d, output:\n%s\nVM exit %d, output:\n%s", c.name, code, lastLines(out, 12), s.exit, lastLines(s.out, 12))
		}
		if len(probs) > 0 {
			r.counters = strings.Join(probs, "; ")
			t.Fatal(strings.Join(probs, "\n"))
		}
		r.result, r.counters = "PASS", "3 processes on one address, all data checks passed"
	})

	t.Run("share_kill9_restart", func(t *testing.T) {
		t0 := time.Now()
		r := row{cell: "sharing 192.0.2.1:4791: pingpong server killed -9, restarted", direction: "3 rocev2d servers <- 3 tool clients (VM)", result: "FAIL"}
		defer func() { r.d = time.Since(t0); add(r) }()
		probs, summary := shareKillAttempt(t, ctx, lab, img)
		if len(probs) == 0 {
			r.result, r.counters = "PASS", summary
			return
		}
		// Once more, loudly: the row says "PASS (rerun)" and keeps the
		// first attempt's problems. This cell failed intermittently (in CI
		// 12-05, and 1 run in 16 here) without a diagnosis yet; the
		// attempt logs the group's steering state and the VM's side.
		first := strings.Join(probs, "; ")
		t.Logf("FIRST ATTEMPT FAILED, running the cell once more: %s", first)
		time.Sleep(share.DefaultTimeWait + time.Second) // the killed member's slot and ranges come free
		// The attempt may have left the VM dead (no ARP, no console
		// message: seen during the orphaned client's resends): reboot it
		// first, loudly.
		if ensureVM(t, ctx, lab, "the rerun of share_kill9_restart") {
			first += "; THE VM STOPPED ANSWERING and was rebooted before the rerun"
		}
		probs, summary = shareKillAttempt(t, ctx, lab, img)
		if len(probs) == 0 {
			r.result, r.counters = "PASS (rerun)", summary+"; FIRST ATTEMPT: "+first
			t.Logf("the rerun passed; the first attempt's problems: %s", first)
			return
		}
		r.counters = "first attempt: " + first + "; rerun: " + strings.Join(probs, "; ")
		t.Fatal(r.counters)
	})
}

// shareKillAttempt runs the kill/restart cell once and returns its problems
// (none: passed) and, when it passed, the row's summary. Everything it
// started is stopped when it returns.
func shareKillAttempt(t *testing.T, ctx context.Context, lab *Lab, img *Image) (problems []string, summary string) {
	t0 := time.Now()
	var hosts []*HostProc
	var vms []*VMCmd
	defer func() {
		for _, h := range hosts {
			select {
			case <-h.Done():
			default:
				h.Cmd.Process.Kill()
				h.Wait()
			}
		}
		for _, v := range vms {
			v.Cancel()
		}
	}()
	fail := func(format string, args ...any) ([]string, string) {
		msg := fmt.Sprintf("stopped at %v: %s", time.Since(t0).Round(time.Second), fmt.Sprintf(format, args...))
		t.Log(msg)
		return []string{msg}, ""
	}
	// Long enough to outlast the kill and the restarted server's
	// run (about 5 s under TCG): rping ~10 pings/s, ib_write_bw ~5 MB/s.
	const rpN, rpS, bwN, ppN, pp2N = 1000, 256, 60000, 100000, 200
	rp, bw, pp, err := shareServers(ctx, lab, img, rpS, bwN, ppN)
	if err != nil {
		return fail("servers: %v", err)
	}
	hosts = append(hosts, rp, bw, pp)
	v, err := lab.StartVM(ctx, agentproto.Request{Cmd: shareClients("b", lab.GIDIndex, rpS, rpN, bwN, ppN), TimeoutSec: 300})
	if err != nil {
		return fail("start the VM clients: %v", err)
	}
	vms = append(vms, v)
	// Traffic runs on all three: rping has pinged a few times.
	waitPings(rp.Output, reServerPingLine, 5, 60*time.Second)
	time.Sleep(time.Second)
	running := func(h *HostProc) bool {
		select {
		case <-h.Done():
			return false
		default:
			return true
		}
	}
	if rpOK, bwOK, ppOK := running(rp), running(bw), running(pp); !rpOK || !bwOK || !ppOK {
		for _, h := range []*HostProc{rp, bw, pp} {
			h.Cmd.Process.Signal(syscall.SIGTERM)
			_, out := h.Wait()
			t.Logf("host %s:\n%s", h.Cmd.Args[1], lastLines(out, 20))
		}
		vm, _ := v.Cancel()
		t.Logf("VM:\n%s", lastLines(vm.Output, 40))
		return fail("a server ended before the kill (running: rping %v, write-bw %v, pingpong %v)", rpOK, bwOK, ppOK)
	}
	pp.Cmd.Process.Signal(syscall.SIGKILL)
	pp.Wait()
	killedAt := time.Now()
	// End the VM's client of the killed server now: its QP keeps
	// resending to the dead QPN (a capture showed the same 4-packet SEND
	// ~960 times in 18 s, far beyond retry_cnt 7) until the client's
	// timeout. Two runs here (and CI 12-05) had the VM stop answering
	// anything (no ARP, no console message) during that storm, as
	// ib_write_bw finished.
	if k, err := lab.Run(ctx, "kill $(cat /tmp/share-b-2.tpid)", 20*time.Second); err != nil || k.Exit != 0 {
		t.Logf("ending the orphaned ibv_rc_pingpong in the VM: exit %d %v: %s", k.Exit, err, k.Output)
	}
	pp2, err := startSharePP(ctx, lab, img, pp2N)
	if err != nil {
		return fail("restart the pingpong server: %v", err)
	}
	hosts = append(hosts, pp2)
	// The restarted server has joined the group (leased its QPN range and
	// listens): the other two must be running across that.
	runningAtJoin := running(rp) && running(bw)
	again, err := lab.Run(ctx, shareClients("c", lab.GIDIndex, 0, 0, 0, pp2N), 120*time.Second)
	if err != nil {
		t.Logf("second pingpong client: VM output:\n%s\nrestarted server:\n%s", lastLines(again.Output, 30), lastLines(pp2.Output(), 30))
		return fail("second pingpong client: %v", err)
	}
	restartD := time.Since(killedAt)
	t.Logf("second pingpong client after %v: VM exit %d, output:\n%s\nrestarted server so far:\n%s",
		restartD.Round(time.Millisecond), again.Exit, lastLines(again.Output, 12), lastLines(pp2.Output(), 12))
	// The group's steering as the restarted client finished: who holds
	// which QPN range, and what the program handed to whom or dropped.
	if st, err := lab.StartHost(ctx, img.Rocev2d, "share", "status", HostIP); err == nil {
		_, out := st.Wait()
		t.Logf("rocev2d share status after the second client:\n%s", out)
	}
	stillRunning := running(rp) && running(bw)
	vm, err := v.Wait(ctx)
	vms = nil // waited for: nothing left to cancel
	if err != nil {
		// Is the VM alive? (a lost command channel with a live VM is
		// the channel's problem, not the VM's)
		alive, aerr := lab.Run(ctx, "echo alive; uptime; ss -tnoi '( sport = :7777 )'; dmesg | tail -40", 20*time.Second)
		t.Logf("after the lost channel: %q %v; VM console:\n%s", alive.Output, aerr, lab.ConsoleTail(30))
		return fail("VM clients: %v (VM answers a new command: %v)", err, aerr == nil)
	}
	secs := shareSections(vm.Output)
	secs2 := shareSections(again.Output)
	var probs []string
	code, out := waitHost(pp2, 30*time.Second)
	s2 := secs2["ibv_rc_pingpong"]
	probs = append(probs, checkShareClient("ibv_rc_pingpong", s2.exit, s2.out, code, out, pp2N, 0)...)
	for _, c := range []struct {
		name string
		h    *HostProc
		n    int
	}{{"rping", rp, rpN}, {"ib_write_bw", bw, bwN}} {
		code, out := waitHost(c.h, 60*time.Second)
		s, ok := secs[c.name]
		if !ok {
			probs = append(probs, c.name+": no output from the VM")
			continue
		}
		probs = append(probs, checkShareClient(c.name, s.exit, s.out, code, out, c.n, rpS)...)
		t.Logf("%s: host exit %d, output:\n%s\nVM exit %d, output:\n%s", c.name, code, lastLines(out, 12), s.exit, lastLines(s.out, 12))
	}
	t.Logf("restarted pingpong: host exit %d, output:\n%s\nVM exit %d, output:\n%s", code, lastLines(out, 8), s2.exit, lastLines(s2.out, 8))
	if s, ok := secs["ibv_rc_pingpong"]; ok && s.exit == 0 {
		probs = append(probs, "the first ibv_rc_pingpong passed although its server was killed")
	}
	t.Logf("killed the pingpong server; restarted and served again within %v; rping and ib_write_bw running when it joined: %v, when its client finished: %v", restartD.Round(time.Millisecond), runningAtJoin, stillRunning)
	if !runningAtJoin {
		probs = append(probs, "rping or ib_write_bw ended before the restarted pingpong server joined (traffic too short to show they were unaffected)")
	}
	if len(probs) > 0 {
		t.Log(strings.Join(probs, "\n"))
		// The VM's side of a failure: rxe's counters and the kernel log.
		if c, err := lab.Counters(ctx); err == nil {
			t.Logf("rxe0 counters: %v", c)
		}
		if d, err := lab.Run(ctx, "dmesg | tail -30", 20*time.Second); err == nil {
			t.Logf("VM dmesg:\n%s", d.Output)
		}
		return probs, ""
	}
	return nil, fmt.Sprintf("restart served in %v; the other two passed", restartD.Round(time.Millisecond))
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
