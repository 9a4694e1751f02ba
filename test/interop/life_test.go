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

// The connection-life cells (issue 26): restarts after kill -9 on either
// side of rping, and fast reconnect loops, against rxe's CM. Each is a
// row of the table; the VM is the suite's.
func init() { labSuites = append(labSuites, lifeSuite) }

const (
	lifeRestarts   = 5
	lifeLoopRounds = 100
	lifeConcurrent = 4
)

func lifeSuite(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	for _, c := range []struct {
		name, label, dir string
		run              func(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error)
	}{
		{"life_rping_vm_client_kill9", fmt.Sprintf("rping -c killed -9 and restarted x%d -> rocev2d rping -s -P", lifeRestarts),
			"rocev2d server <- tool client (VM)", lifeVMClientKill},
		{"life_rocev2d_client_kill9", fmt.Sprintf("rocev2d rping -c killed -9 and restarted x%d -> rping -s -P", lifeRestarts),
			"rocev2d client -> tool server (VM)", lifeHostClientKill},
		{"life_rocev2d_client_kill9_guardian", "rocev2d rping -c killed -9, no restart -> rping -s -P",
			"rocev2d client -> tool server (VM)", lifeHostClientKillGuardian},
		{"life_rping_loop", fmt.Sprintf("%d x rping -c -C 1 -> rocev2d rping -s -P", lifeLoopRounds),
			"rocev2d server <- tool client (VM)", lifeVMLoop},
		{"life_rping_persistent_concurrent", fmt.Sprintf("%d rping -c -C 20 at once -> rocev2d rping -s -P", lifeConcurrent),
			"rocev2d server <- tool client (VM)", lifeVMConcurrent},
	} {
		t.Run(c.name, func(t *testing.T) {
			t0 := time.Now()
			r := row{cell: c.label, direction: c.dir, result: "FAIL"}
			defer func() { r.d = time.Since(t0); add(r) }()
			note, err := c.run(t, ctx, lab, img)
			r.counters = note
			if err != nil {
				r.counters = strings.SplitN(err.Error(), "\n", 2)[0]
				t.Fatal(err)
			}
			r.result = "PASS"
			t.Logf("%s: %s in %.1fs", c.name, note, time.Since(t0).Seconds())
		})
	}
}

// startPersistentServer starts rocev2d rping -s -P on the host and waits
// for its RoCEv2 socket.
func startPersistentServer(ctx context.Context, lab *Lab, img *Image, port int) (*HostProc, error) {
	h, err := lab.StartHost(ctx, img.Rocev2d, "rping", "-s", "-P", "-a", HostIP, "-p", strconv.Itoa(port), "-v", "--counters")
	if err != nil {
		return nil, err
	}
	if err := waitHostRoCE(h, 20*time.Second); err != nil {
		h.Cmd.Process.Signal(syscall.SIGTERM)
		h.Wait()
		return nil, err
	}
	return h, nil
}

// stopServer stops a persistent server and returns its output.
func stopServer(h *HostProc) string {
	h.Cmd.Process.Signal(syscall.SIGTERM)
	_, out := waitHost(h, 20*time.Second)
	return out
}

var reRejected = regexp.MustCompile(`RDMA_CM_EVENT_REJECTED|connect error`)

// lifeVMClientKill: rping in the VM pings a persistent rocev2d server
// without end and is killed with SIGKILL mid-run (its kernel destroys the
// cm_id and disconnects), lifeRestarts times; every restart connects and
// pings; a last run of 5 pings exits 0.
func lifeVMClientKill(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error) {
	const port = 7190
	h, err := startPersistentServer(ctx, lab, img, port)
	if err != nil {
		return "", err
	}
	defer func() {
		if h != nil {
			stopServer(h)
		}
	}()
	for i := 0; i < lifeRestarts; i++ {
		before := len(reServerPingLine.FindAllStringIndex(h.Output(), -1))
		v, err := lab.StartVM(ctx, agentproto.Request{Cmd: fmt.Sprintf("rping -c -a %s -p %d -C 0 -v 2>&1", HostIP, port), TimeoutSec: 120})
		if err != nil {
			return "", err
		}
		waitPings(h.Output, reServerPingLine, before+10, 60*time.Second)
		vm, _ := v.Cancel() // SIGKILL to its process group
		if n := len(reServerPingLine.FindAllStringIndex(h.Output(), -1)) - before; n < 10 {
			return "", fmt.Errorf("restart %d: the server took %d pings in 60 s\n--- rping (VM):\n%s\n--- rocev2d:\n%s", i, n, vm.Output, cmTail(h.Output()))
		}
	}
	vm, err := lab.Run(ctx, fmt.Sprintf("rping -c -a %s -p %d -C 5 -v -V 2>&1", HostIP, port), 60*time.Second)
	if err != nil || vm.Exit != 0 {
		return "", fmt.Errorf("last client: exit %d %v\n%s", vm.Exit, err, vm.Output)
	}
	out := stopServer(h)
	h = nil
	if reRejected.MatchString(out) || cmStat(out, "cm_rej_stale") != 0 {
		return "", fmt.Errorf("the server rejected or failed a connection:\n%s", cmTail(out))
	}
	if n := cmStat(out, "cm_established"); n != lifeRestarts+1 {
		return "", fmt.Errorf("the server established %d connections, want %d:\n%s", n, lifeRestarts+1, cmTail(out))
	}
	return fmt.Sprintf("%d restarts, cm_established=%d cm_rej_stale=%d", lifeRestarts, cmStat(out, "cm_established"), cmStat(out, "cm_rej_stale")), nil
}

// lifeHostClientKill: rocev2d's rping client pings rping -P in the VM
// without end and is killed with SIGKILL (it sends nothing), lifeRestarts
// times; every restart — a new process on the same address — connects
// (the kernel CM does not take it for the old connection), sends the
// killed one's DREQ from the connection journal (rdmacm.JournalEnv) and
// pings; a last run of 5 pings exits 0, and then the Linux server holds
// no connection of theirs (before the journal, every killed client's
// cm_id stayed in CONNECT for good).
func lifeHostClientKill(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error) {
	const port = 7191
	v, err := lab.StartVM(ctx, agentproto.Request{Cmd: fmt.Sprintf("rping -s -P -a %s -p %d 2>&1", lab.vmIP(), port), TimeoutSec: 300})
	if err != nil {
		return "", err
	}
	defer v.Cancel()
	if err := waitRdmaCMListen(ctx, lab, port, "TCP", 20*time.Second); err != nil {
		return "", err
	}
	for i := 0; i < lifeRestarts; i++ {
		h, err := lab.StartHost(ctx, img.Rocev2d, "rping", "-c", "-a", lab.vmIP(), "-p", strconv.Itoa(port), "-C", "0", "-v")
		if err != nil {
			return "", err
		}
		waitPings(h.Output, rePingLine, 10, 60*time.Second)
		h.Cmd.Process.Signal(syscall.SIGKILL)
		_, out := h.Wait()
		if n := len(rePingLine.FindAllStringIndex(out, -1)); n < 10 {
			return "", fmt.Errorf("restart %d: %d pings in 60 s\n%s", i, n, cmTail(out))
		}
	}
	h, err := lab.StartHost(ctx, img.Rocev2d, "rping", "-c", "-a", lab.vmIP(), "-p", strconv.Itoa(port), "-C", "5", "-v", "-V", "--counters")
	if err != nil {
		return "", err
	}
	code, out := waitHost(h, 60*time.Second)
	if code != 0 || len(rePingLine.FindAllStringIndex(out, -1)) != 5 {
		return "", fmt.Errorf("last client: exit %d\n%s", code, cmTail(out))
	}
	// (Which process sent a killed one's DREQ is not checked: another
	// rocev2d process of the lab on the host's address, sharing it,
	// speaks for a dead member within 2 s too.)
	// rping -P ends a connection's thread on its DISCONNECTED event and
	// destroys the cm_id: none of the clients' may be left connected.
	script := fmt.Sprintf(`for i in $(seq 50); do n=$(rdma res show cm_id | grep -c 'state CONNECT.*src-addr %s:%d'); [ "$n" -eq 0 ] && break; sleep 0.1; done
echo "connected=$n"; rdma res show cm_id; [ "$n" -eq 0 ]`, lab.vmIP(), port)
	vm, err := lab.Run(ctx, script, 30*time.Second)
	if err != nil || vm.Exit != 0 {
		return "", fmt.Errorf("the Linux server kept connections of killed clients (exit %d %v):\n%s", vm.Exit, err, tail(vm.Output, 20))
	}
	return fmt.Sprintf("%d restarts, last: cm_retransmits=%d cm_dreq_for_dead=%d, Linux server: no connection left", lifeRestarts, cmStat(out, "cm_retransmits"), cmStat(out, "cm_dreq_for_dead")), nil
}

// lifeHostClientKillGuardian: rocev2d's rping client pings rping -P in
// the VM and is killed with SIGKILL; nothing is restarted on the host's
// address (and no other rocev2d process runs there in this cell). Its
// guardian (rdmacm/guardian, on by default in rocev2d) sends the DREQ the
// kernel would have sent for a killed process's cm_id: the Linux server's
// cm_id leaves CONNECT within a few seconds. Without the guardian it
// stays there for good (rping -P's thread waits in its receive).
func lifeHostClientKillGuardian(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error) {
	const port = 7194
	v, err := lab.StartVM(ctx, agentproto.Request{Cmd: fmt.Sprintf("rping -s -P -v -a %s -p %d 2>&1", lab.vmIP(), port), TimeoutSec: 120})
	if err != nil {
		return "", err
	}
	defer v.Cancel()
	if err := waitRdmaCMListen(ctx, lab, port, "TCP", 20*time.Second); err != nil {
		return "", err
	}
	h, err := lab.StartHost(ctx, img.Rocev2d, "rping", "-c", "-a", lab.vmIP(), "-p", strconv.Itoa(port), "-C", "0", "-v")
	if err != nil {
		return "", err
	}
	waitPings(h.Output, rePingLine, 10, 60*time.Second)
	h.Cmd.Process.Signal(syscall.SIGKILL)
	_, out := h.Wait()
	if n := len(rePingLine.FindAllStringIndex(out, -1)); n < 10 {
		return "", fmt.Errorf("%d pings in 60 s\n%s", n, cmTail(out))
	}
	killed := time.Now()
	script := fmt.Sprintf(`for i in $(seq 50); do n=$(rdma res show cm_id | grep -c 'state CONNECT.*src-addr %s:%d'); [ "$n" -eq 0 ] && break; sleep 0.1; done
echo "connected=$n"; rdma res show cm_id; [ "$n" -eq 0 ]`, lab.vmIP(), port)
	vm, err := lab.Run(ctx, script, 30*time.Second)
	if err != nil || vm.Exit != 0 {
		srv, _ := v.Cancel()
		return "", fmt.Errorf("the Linux server's connection to the killed client stayed (exit %d %v):\n%s\n--- rping (VM):\n%s", vm.Exit, err, tail(vm.Output, 20), tail(srv.Output, 20))
	}
	gone := time.Since(killed)
	// rping prints its cm_id's DISCONNECTED event: the DREQ's, not a
	// retry-exhausted QP's error.
	srv, _ := v.Cancel()
	if !strings.Contains(srv.Output, "server DISCONNECT EVENT") {
		return "", fmt.Errorf("the Linux server did not report the disconnect:\n%s", tail(srv.Output, 20))
	}
	return fmt.Sprintf("Linux server: DISCONNECT EVENT, no connection left %.1fs after the kill, no restart", gone.Seconds()), nil
}

// lifeVMLoop: lifeLoopRounds runs of rping -c -C 1 back to back from the
// VM against one persistent rocev2d server: none is rejected.
func lifeVMLoop(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error) {
	const port = 7192
	h, err := startPersistentServer(ctx, lab, img, port)
	if err != nil {
		return "", err
	}
	defer func() {
		if h != nil {
			stopServer(h)
		}
	}()
	// A run that exits 255 with rping's own teardown race after its ping
	// and its DISCONNECT EVENT (rpingTeardownRace) is counted as a race,
	// not a failure; the server's cm_established count below still
	// checks that every run connected.
	script := fmt.Sprintf(`fails=0; races=0; start=$(date +%%s)
for i in $(seq %d); do
  rping -c -a %s -p %d -C 1 -v >/tmp/life.out 2>&1; rc=$?
  if [ $rc -eq 255 ] && grep -q 'ping data: rdma-ping-0' /tmp/life.out && grep -q 'client DISCONNECT EVENT' /tmp/life.out && grep -q 'rdma_get_cm_event: Bad file descriptor' /tmp/life.out; then
    races=$((races+1)); echo "run $i: rping teardown race:"; cat /tmp/life.out
  elif [ $rc -ne 0 ]; then
    fails=$((fails+1)); echo "run $i:"; cat /tmp/life.out
  fi
done
echo "fails=$fails rping_teardown_races=$races seconds=$(( $(date +%%s) - start ))"
[ $fails -eq 0 ]`, lifeLoopRounds, HostIP, port)
	vm, err := lab.Run(ctx, script, 600*time.Second)
	if err != nil || vm.Exit != 0 {
		return "", fmt.Errorf("%d rping runs: exit %d %v\n%s", lifeLoopRounds, vm.Exit, err, tail(vm.Output, 40))
	}
	out := stopServer(h)
	h = nil
	if n := cmStat(out, "cm_established"); n != lifeLoopRounds || cmStat(out, "cm_rej_stale") != 0 {
		return "", fmt.Errorf("server: cm_established=%d (want %d) cm_rej_stale=%d\n%s", n, lifeLoopRounds, cmStat(out, "cm_rej_stale"), cmTail(out))
	}
	last := strings.TrimSpace(vm.Output)
	if i := strings.LastIndex(last, "\n"); i >= 0 {
		last = last[i+1:]
	}
	return fmt.Sprintf("%s, cm_established=%d cm_rej_stale=0", last, cmStat(out, "cm_established")), nil
}

// lifeVMConcurrent: lifeConcurrent rping clients in the VM at once against
// one persistent rocev2d server: all pass (-V), the server takes every
// ping of each.
func lifeVMConcurrent(t *testing.T, ctx context.Context, lab *Lab, img *Image) (string, error) {
	const port, count = 7193, 20
	h, err := startPersistentServer(ctx, lab, img, port)
	if err != nil {
		return "", err
	}
	defer func() {
		if h != nil {
			stopServer(h)
		}
	}()
	script := fmt.Sprintf(`pids=""
for i in $(seq %d); do rping -c -a %s -p %d -C %d -v -V >/tmp/conc$i.out 2>&1 & pids="$pids $!"; done
fails=0; for p in $pids; do wait $p || fails=$((fails+1)); done
[ $fails -eq 0 ] || cat /tmp/conc*.out
echo "fails=$fails"; [ $fails -eq 0 ]`, lifeConcurrent, HostIP, port, count)
	vm, err := lab.Run(ctx, script, 300*time.Second)
	if err != nil || vm.Exit != 0 {
		return "", fmt.Errorf("%d rping clients at once: exit %d %v\n%s", lifeConcurrent, vm.Exit, err, tail(vm.Output, 40))
	}
	out := stopServer(h)
	h = nil
	if n := len(reServerPingLine.FindAllStringIndex(out, -1)); n != lifeConcurrent*count || cmStat(out, "cm_established") != lifeConcurrent || reRejected.MatchString(out) {
		return "", fmt.Errorf("server: %d pings (want %d), cm_established=%d (want %d)\n%s", n, lifeConcurrent*count,
			cmStat(out, "cm_established"), lifeConcurrent, cmTail(out))
	}
	return fmt.Sprintf("%d clients x %d pings, cm_established=%d", lifeConcurrent, count, cmStat(out, "cm_established")), nil
}
