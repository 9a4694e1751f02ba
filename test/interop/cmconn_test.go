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
)

// Connection liveness against rxe (issue 26), in the same VM boot as the
// matrix (labSuites):
//
//   - keep-alive, both roles: an rdma_cm connection between rocev2d's
//     rdma-client/-server and the VM's rdma_server/rdma_client stays idle
//     for kaIdle with keep-alive probes every kaInterval (zero-length RDMA
//     WRITEs, which rxe's responder answers without its application); it
//     must survive with no false alarm and complete its exchange. Then a
//     second connection goes idle and the whole VM is frozen (SIGSTOP to
//     qemu: the peer vanishes without a DREQ, as a crashed host does);
//     rocev2d must declare it dead within 2×interval + timeout (+ the
//     probe's own retries, ~0.5 s) and say why.
//   - the CM over IPv6: rping over rxe0's link-local RoCEv2 GID (VMLL) and
//     rocev2d on HostLL%rv2br0, both roles.
func init() { labSuites = append(labSuites, cmConnSuite) }

const (
	kaInterval = 2 * time.Second
	kaTimeout  = 2 * time.Second
	kaIdle     = 60 * time.Second
)

var reKALine = regexp.MustCompile(`connection lost after ([0-9.]+)s idle: (.*)`)

func cmConnSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, server := range []bool{false, true} {
		role := map[bool]string{true: "server", false: "client"}[server]
		dir := "rocev2d client -> tool server (VM)"
		if server {
			dir = "rocev2d server <- tool client (VM)"
		}
		t.Run("keepalive_idle_"+role, func(t *testing.T) {
			r := row{cell: fmt.Sprintf("keep-alive, %v idle (probe every %v)", kaIdle, kaInterval), direction: dir, result: "FAIL"}
			defer func() { add(r) }()
			runKeepAlive(t, ctx, lab, img, server, false, &r)
		})
		t.Run("keepalive_dead_"+role, func(t *testing.T) {
			r := row{cell: fmt.Sprintf("keep-alive, VM frozen while idle (%v + %v)", kaInterval, kaTimeout), direction: dir, result: "FAIL"}
			defer func() { add(r) }()
			runKeepAlive(t, ctx, lab, img, server, true, &r)
		})
	}
	for _, server := range []bool{true, false} {
		role := map[bool]string{true: "server", false: "client"}[server]
		dir := "rocev2d client -> tool server (VM)"
		if server {
			dir = "rocev2d server <- tool client (VM)"
		}
		t.Run("rping_ipv6_ll_rocev2d_"+role, func(t *testing.T) {
			r := row{cell: "rping over IPv6 link-local (CM)", direction: dir, result: "FAIL"}
			defer func() { add(r) }()
			runRpingIPv6(t, ctx, lab, img, server, &r)
		})
	}
}

// runKeepAlive runs one keep-alive cell; dead freezes the VM while idle.
func runKeepAlive(t *testing.T, ctx context.Context, lab *Lab, img *Image, server, dead bool, r *row) {
	t0 := time.Now()
	defer func() { r.d = time.Since(t0) }()
	fail := func(format string, args ...any) {
		t.Helper()
		r.counters = strings.SplitN(fmt.Sprintf(format, args...), "\n", 2)[0]
		t.Fatalf(format, args...)
	}
	idle := kaIdle
	if dead {
		idle = 10 * time.Minute // ended by the keep-alive, never by the clock
	}
	ka := []string{"--idle", idle.String(), "--keepalive", kaInterval.String(), "--keepalive-timeout", kaTimeout.String(), "--counters"}
	var h *HostProc
	var v *VMCmd
	var err error
	if server {
		h, err = lab.StartHost(ctx, img.Rocev2d, append([]string{"rdma-server", "-s", HostIP, "--timeout", "300s"}, ka...)...)
		if err != nil {
			fail("start rocev2d: %v", err)
		}
		if err := waitHostRoCE(h, 20*time.Second); err != nil {
			fail("rocev2d: %v", err)
		}
		v, err = lab.StartVM(ctx, agentproto.Request{Cmd: "rdma_client -s " + HostIP, TimeoutSec: 300})
	} else {
		v, err = lab.StartVM(ctx, agentproto.Request{Cmd: "rdma_server -s " + VMIP, TimeoutSec: 300})
		if err == nil {
			err = waitRdmaCMListen(ctx, lab, rdmaExPort, "TCP", 20*time.Second)
		}
		if err == nil {
			h, err = lab.StartHost(ctx, img.Rocev2d, append([]string{"rdma-client", "-s", VMIP, "--bind", HostIP, "--timeout", "300s"}, ka...)...)
		}
	}
	if err != nil {
		if v != nil {
			v.Cancel()
		}
		fail("start: %v", err)
	}
	defer v.Cancel()
	tool := map[bool]string{true: "rdma_server", false: "rdma_client"}[server]
	// Connected: rocev2d says it goes idle.
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(h.Output(), tool+": connected, idle") {
		select {
		case <-h.Done():
			_, out := h.Wait()
			fail("rocev2d ended before connecting:\n%s", out)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.Cmd.Process.Signal(syscall.SIGTERM)
			_, out := h.Wait()
			fail("rocev2d did not connect in 60 s:\n%s", out)
		}
	}
	if !dead {
		code, out := waitHost(h, idle+90*time.Second)
		vm, vmErr := v.Wait(ctx)
		var p []string
		if code != 0 || !strings.Contains(out, tool+": connection alive after "+idle.String()+" idle") || !strings.Contains(out, tool+": end 0") {
			p = append(p, fmt.Sprintf("rocev2d exit %d: %s", code, cmTail(out)))
		}
		if vmErr != nil || vm.Exit != 0 {
			p = append(p, fmt.Sprintf("VM tool exit %d (%v): %s", vm.Exit, vmErr, cmTail(vm.Output)))
		}
		probes := cmStat(out, "cm_keepalive_probes")
		if min := int(idle/kaInterval) / 3; probes < min {
			p = append(p, fmt.Sprintf("%d keep-alive probes in %v idle, want at least %d", probes, idle, min))
		}
		if n := cmStat(out, "cm_keepalive_dead") + cmStat(out, "cm_lost_qp"); n != 0 {
			p = append(p, fmt.Sprintf("%d false alarms", n))
		}
		r.packets = fmt.Sprintf("%d probes, no false alarm", probes)
		if len(p) > 0 {
			fail("%s\nrocev2d:\n%s\nVM:\n%s", strings.Join(p, "\n"), out, vm.Output)
		}
		r.result = "ok"
		return
	}
	// Freeze the VM a little into the idle time: no packet, no DREQ.
	time.Sleep(3 * time.Second)
	qemu := lab.qemu.Process
	if err := qemu.Signal(syscall.SIGSTOP); err != nil {
		fail("SIGSTOP qemu: %v", err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			qemu.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	limit := 2*kaInterval + kaTimeout + 3*time.Second // + the probe's retries and scheduling slack
	code, out := waitHost(h, limit+30*time.Second)
	found := time.Since(stopped)
	resume()
	m := reKALine.FindStringSubmatch(out)
	r.packets = fmt.Sprintf("dead after %.1fs (limit %v)", found.Seconds(), limit)
	var p []string
	if m == nil || code == 0 {
		p = append(p, fmt.Sprintf("rocev2d exit %d, no \"connection lost\" line", code))
	} else if !strings.Contains(m[2], "keep-alive") {
		p = append(p, "lost for another reason than keep-alive: "+m[2])
	}
	if found > limit {
		p = append(p, fmt.Sprintf("declared dead %v after the VM froze, want within %v", found, limit))
	}
	if n := cmStat(out, "cm_keepalive_dead"); n != 1 {
		p = append(p, fmt.Sprintf("cm_keepalive_dead %d, want 1", n))
	}
	if len(p) > 0 {
		fail("%s\nrocev2d:\n%s", strings.Join(p, "\n"), out)
	}
	// Let the VM catch up before the next cell (its tool is killed).
	time.Sleep(2 * time.Second)
	r.result = "ok"
}

// stderrAfter sends a VM tool's stderr after its stdout (as runCMCell
// does): its stdout is a block-buffered pipe, and a merged stderr line
// could land in the middle of a stdout line.
const stderrAfter = " 2>/tmp/cm6.err; s=$?; cat /tmp/cm6.err; exit $s"

// runRpingIPv6 runs rping between rocev2d and the VM over the link-local
// RoCEv2 GIDs: the CM's REQ/REP/RTU/DREQ/DREP over IPv6.
func runRpingIPv6(t *testing.T, ctx context.Context, lab *Lab, img *Image, server bool, r *row) {
	t0 := time.Now()
	defer func() { r.d = time.Since(t0) }()
	fail := func(format string, args ...any) {
		t.Helper()
		r.counters = strings.SplitN(fmt.Sprintf(format, args...), "\n", 2)[0]
		t.Fatalf(format, args...)
	}
	if lab.GID6Index < 0 {
		fail("rxe0 has no link-local RoCEv2 GID")
	}
	const count = 20
	size := strconv.Itoa(rpingSize)
	var h *HostProc
	var v *VMCmd
	var err error
	if server {
		h, err = lab.StartHost(ctx, img.Rocev2d, "rping", "-s", "-a", hostLLZone, "-v", "-V", "-S", size, "--counters")
		if err != nil {
			fail("start rocev2d: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
		select {
		case <-h.Done():
			_, out := h.Wait()
			fail("rocev2d rping server ended:\n%s", out)
		default:
		}
		v, err = lab.StartVM(ctx, agentproto.Request{Cmd: fmt.Sprintf("rping -c -a %s%%%s -v -V -S %s -C %d"+stderrAfter, HostLL, VMDev, size, count), TimeoutSec: 120})
	} else {
		v, err = lab.StartVM(ctx, agentproto.Request{Cmd: fmt.Sprintf("rping -s -a %s%%%s -v -V -S %s -C %d"+stderrAfter, VMLL, VMDev, size, count), TimeoutSec: 120})
		if err == nil {
			err = waitRdmaCMListen(ctx, lab, rpingPort, "TCP", 20*time.Second)
		}
		if err == nil {
			h, err = lab.StartHost(ctx, img.Rocev2d, "rping", "-c", "-a", VMLL+"%"+Bridge, "--bind", hostLLZone, "-v", "-V", "-S", size,
				"-C", strconv.Itoa(count), "--timeout", "120s", "--counters")
		}
	}
	if err != nil {
		if v != nil {
			v.Cancel()
		}
		fail("start: %v", err)
	}
	var hostOut string
	var vm agentproto.Response
	var vmErr error
	if server {
		wctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		vm, vmErr = v.Wait(wctx)
		cancel()
		_, hostOut = waitHost(h, 20*time.Second) // it serves one client and exits
	} else {
		_, hostOut = waitHost(h, 120*time.Second)
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		vm, vmErr = v.Wait(wctx)
		cancel()
	}
	var p []string
	if vmErr != nil || vm.Exit != 0 {
		p = append(p, fmt.Sprintf("rping in the VM: exit %d %v", vm.Exit, vmErr))
	}
	p = append(p, checkRpingOutputs(hostOut, vm.Output, !server, count)...)
	if cmStat(hostOut, "cm_established") != 1 {
		p = append(p, fmt.Sprintf("cm_established %d, want 1", cmStat(hostOut, "cm_established")))
	}
	if len(p) > 0 {
		fail("%s\nrocev2d:\n%s\nVM:\n%s", strings.Join(p, "\n"), hostOut, vm.Output)
	}
	r.packets = fmt.Sprintf("%d pings over %s", count, VMLL)
	r.result = "ok"
}
