//go:build linux

package interop

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorocev2/rocev2/test/interop/agentproto"
)

// nvme-cli (Debian's nvme-cli 2.3 with libnvme 1.3, copied into the VM)
// against rocev2d nvmf-target, as a storage administrator would use it;
// see nvmfSuite for where the cells run. What nvme-cli answers here was
// compared with what Linux nvmet answers to the same commands in this VM
// (2026-12-07, kernel 6.1): where both refuse a command (compare, which
// neither advertises in ONCS) the check is the refusal, and the ANA log
// page, which nvmet advertises and rocev2d does not, is refused. The
// error log and the controller type are checked: both were empty (0,
// "reserved") where nvmet filled them.

// nvmfCLIScript runs nvme-cli's commands with a check of each output
// ("ok NAME" or "FAIL NAME: ...") and ends with "cli checks failed: N".
const nvmfCLIScript = `A=` + HostIP + `; N=` + nvmfNQN + `
# want NAME PATTERN CMD...: CMD's output (stdout and stderr) must match the
# extended regexp PATTERN.
want() {
	n=$1; p=$2; shift 2
	o=$("$@" 2>&1); rc=$?
	if echo "$o" | grep -q -E -- "$p"; then echo "ok $n (rc $rc)"; else echo "FAIL $n: rc $rc, want /$p/ from: $*"; echo "$o" | head -20; bad=$((bad+1)); fi
}
bad=0
want discover "subnqn: +$N" nvme discover -t rdma -a $A -s 4420
want connect-all "" nvme connect-all -t rdma -a $A -s 4420
want list-subsys "nvme[0-9]+ rdma traddr=$A,trsvcid=4420 live" nvme list-subsys
want disconnect-all "" nvme disconnect-all
want connect-opts "" nvme connect -t rdma -a $A -s 4420 -n $N -i 1 -Q 32 -k 7 -l 30 -c 2 --hostid=11111111-2222-3333-4444-555555555555
c=/sys/class/nvme/nvme0
want sysfs "^sqsize=31 kato=7 loss=30 delay=2 live$" echo "sqsize=$(cat $c/sqsize) kato=$(cat $c/kato) loss=$(cat $c/ctrl_loss_tmo) delay=$(cat $c/reconnect_delay) $(cat $c/state)"
want cntrltype "^io$" cat $c/cntrltype
want list "/dev/nvme0n1 .* rocev2 " nvme list
want id-ctrl "subnqn +: $N" nvme id-ctrl /dev/nvme0
want id-ctrl-oncs "oncs +: 0xc" nvme id-ctrl /dev/nvme0
want id-ns "nsze +: 0x20000" nvme id-ns /dev/nvme0n1
want list-ns '\[ +0\]:0x1' nvme list-ns /dev/nvme0
want ns-descs "nguid +: [0-9a-f]{32}" nvme ns-descs /dev/nvme0n1
want smart-log "critical_warning" nvme smart-log /dev/nvme0
want error-log "Error Log Entries" nvme error-log /dev/nvme0
want get-feature-vwc "Current value:0x00000001" nvme get-feature /dev/nvme0 -f 6
want get-feature-nq "Number of Queues" nvme get-feature /dev/nvme0 -f 7
want get-feature-aec "Async Event Configuration" nvme get-feature /dev/nvme0 -f 0xb
want get-feature-kato "Current value:0x00001b58" nvme get-feature /dev/nvme0 -f 0xf
want get-feature-hostid "0000: 11 11 11 11 22 22 33 33 44 44 55 55 55 55 55 55" nvme get-feature /dev/nvme0 -f 0x81 -c 1 -l 16
want get-log-changed-ns "log-id:4" nvme get-log /dev/nvme0 --log-id=4 --log-len=16
want ana-log-not-advertised "Invalid Log Page" nvme ana-log /dev/nvme0
want compare-unsupported "Invalid Command Opcode" nvme compare /dev/nvme0n1 -s 0 -c 7 -z 4096 -d /dev/zero
# Data: 64 KiB at LBA 2048, flush, write-zeroes of 15 blocks in it (what
# is read back must be the data with those blocks zero), DSM deallocate
# elsewhere and one past the end, blkdiscard, a reset, data again.
dd if=/dev/urandom of=/tmp/w bs=65536 count=1 2>/dev/null
dd if=/tmp/w of=/dev/nvme0n1 bs=65536 seek=16 oflag=direct 2>/dev/null
want flush "NVMe Flush: success" nvme flush /dev/nvme0n1
want write-zeroes "Write Zeroes Success" nvme write-zeroes /dev/nvme0n1 -s 2056 -c 14
dd if=/dev/zero of=/tmp/w bs=512 seek=8 count=15 conv=notrunc 2>/dev/null
want write-zeroes-data "^same$" sh -c 'dd if=/dev/nvme0n1 bs=65536 skip=16 count=1 iflag=direct 2>/dev/null | cmp - /tmp/w && echo same'
want dsm-deallocate "NVMe DSM: success" nvme dsm /dev/nvme0n1 --ad -s 8192 -b 64
want dsm-out-of-range "LBA Out of Range" nvme dsm /dev/nvme0n1 --ad -s 131072 -b 8
want error-log-entry "status_field.*LBA Out of Range" nvme error-log /dev/nvme0 -e 1
want smart-log-errors "num_err_log_entries[[:space:]]+: [1-9]" nvme smart-log /dev/nvme0
want blkdiscard "^rc=0$" sh -c 'blkdiscard -o 8388608 -l 1048576 /dev/nvme0n1; echo rc=$?'
want reset "^live$" sh -c 'nvme reset /dev/nvme0 && sleep 1 && cat /sys/class/nvme/nvme0/state'
want after-reset "^same$" sh -c 'dd if=/dev/nvme0n1 bs=65536 skip=16 count=1 iflag=direct 2>/dev/null | cmp - /tmp/w && echo same'
want disconnect "disconnected 1 controller" nvme disconnect -n $N
want gone "^none$" sh -c 'ls /sys/class/nvme/ | grep -q nvme || echo none'
echo "ctrl nvme-cli: $bad checks failed"
[ $bad = 0 ]
`

// checkNvmfCLI: every check ran and passed.
func checkNvmfCLI(out string) []string {
	want := strings.Count(nvmfCLIScript, "\nwant ")
	var probs []string
	if n := len(regexp.MustCompile(`(?m)^ok \S+ \(rc \d+\)$`).FindAllString(out, -1)); n != want {
		probs = append(probs, fmt.Sprintf("%d nvme-cli checks passed, want %d", n, want))
	}
	for _, l := range regexp.MustCompile(`(?m)^FAIL .*$`).FindAllString(out, -1) {
		probs = append(probs, l)
	}
	return probs
}

// nvmfCrashScript connects with ctrl_loss_tmo 30 s, reconnect delay 1 s and
// a 2 s keep-alive, writes blocks of 64 KiB one by one with O_DIRECT
// (the target is stopped and started again meanwhile), reads them all
// back and compares, and prints the md5 of what it wrote.
func nvmfCrashScript(blocks int) string {
	return fmt.Sprintf(`A=%s; N=%s; B=%d
dd if=/dev/urandom of=/tmp/src bs=65536 count=$B iflag=fullblock 2>/dev/null
nvme connect -t rdma -a $A -s 4420 -n $N -l 30 -c 1 -k 2 || { echo "FAIL connect"; exit 1; }
i=0; while [ ! -b /dev/nvme0n1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "io start"
fails=0
for i in $(seq 0 $((B-1))); do
	# A host that gave up removed the device: no dd of= creating a
	# regular file in its place.
	[ -b /dev/nvme0n1 ] || { fails=$((fails+1)); continue; }
	dd if=/tmp/src of=/dev/nvme0n1 bs=65536 skip=$i seek=$i count=1 oflag=direct 2>/tmp/e || { fails=$((fails+1)); echo "write $i: $(tail -1 /tmp/e)"; }
done
[ -b /dev/nvme0n1 ] && dd if=/dev/nvme0n1 of=/tmp/back bs=65536 count=$B iflag=direct 2>/dev/null
cmp /tmp/src /tmp/back && [ $fails = 0 ] && echo "intact md5=$(md5sum < /tmp/src | cut -d' ' -f1)"
echo "state $(cat /sys/class/nvme/nvme0/state)"
dmesg | grep -E 'nvme nvme0: (Reconnecting|Successfully reconnected|starting error recovery)' | tail -3
nvme disconnect-all
`, HostIP, nvmfNQN, blocks)
}

var reNvmfIntact = regexp.MustCompile(`(?m)^intact md5=([0-9a-f]{32})$`)

// nvmfCrashRestart: the Linux host writes through rocev2d nvmf-target while
// the target is killed (SIGKILL) and started again on the same file 2 s
// later, then stopped with SIGINT (it disconnects its hosts) and started
// again: each time the host reconnects by itself (ctrl_loss_tmo 30 s) and
// every block it wrote is in the VM's read-back and in the target's file.
// It runs when the suite's own target has stopped (the same address and
// port).
func nvmfCrashRestart(t *testing.T, ctx context.Context, lab *Lab, img *Image, add func(row)) {
	file := filepath.Join(lab.Dir, "nvmf-crash.img")
	os.Remove(file)
	args := []string{"nvmf-target", "--bind", HostIP, "--nqn", nvmfNQN, "--file", file, "--size", strconv.Itoa(nvmfSize), "-v"}
	start := func() (*HostProc, error) {
		h, err := lab.StartHost(ctx, img.Rocev2d, args...)
		if err != nil {
			return nil, err
		}
		if err := waitHostRoCE(h, 15*time.Second); err != nil {
			return nil, err
		}
		return h, nil
	}
	const blocks = 400
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGINT} {
		name := map[syscall.Signal]string{syscall.SIGKILL: "crash_restart", syscall.SIGINT: "stop_restart"}[sig]
		sigName := map[syscall.Signal]string{syscall.SIGKILL: "SIGKILL", syscall.SIGINT: "SIGINT"}[sig]
		t.Run(name, func(t *testing.T) {
			t0 := time.Now()
			r := row{cell: fmt.Sprintf("nvme connect -l 30 -c 1 -k 2, O_DIRECT writes; target %s, started again on its file 2 s later: reconnected, %d x 64 KiB intact", sigName, blocks),
				direction: "Linux nvme-rdma host (VM) -> rocev2d nvmf-target", result: "FAIL"}
			defer func() { r.d = time.Since(t0); add(r) }()
			h, err := start()
			if err != nil {
				r.counters = err.Error()
				t.Fatal(err)
			}
			var h2 *HostProc
			defer func() {
				for _, p := range []*HostProc{h, h2} {
					if p != nil {
						p.Cmd.Process.Signal(syscall.SIGINT)
						select {
						case <-p.Done():
						case <-time.After(30 * time.Second):
							p.Cmd.Process.Kill()
						}
					}
				}
			}()
			v, err := lab.StartVM(ctx, agentproto.Request{Cmd: nvmfCrashScript(blocks), TimeoutSec: 240})
			if err != nil {
				r.counters = err.Error()
				t.Fatal(err)
			}
			// The host's I/O queue is connected, and its writes run: stop
			// the target in the middle of them.
			deadline := time.Now().Add(2 * time.Minute)
			for !strings.Contains(h.Output(), "qid 1 connected") && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(2 * time.Second)
			h.Cmd.Process.Signal(sig)
			code, out := h.Wait()
			var probs []string
			if sig == syscall.SIGINT && (code != 0 || !strings.Contains(out, "nvmf-target: stopped")) {
				probs = append(probs, fmt.Sprintf("SIGINT: exit %d", code))
			}
			time.Sleep(2 * time.Second)
			if h2, err = start(); err != nil {
				r.counters = "restart: " + err.Error()
				t.Fatal(err)
			}
			res, err := v.Wait(ctx)
			if err != nil {
				probs = append(probs, err.Error())
			}
			if res.Exit != 0 {
				probs = append(probs, fmt.Sprintf("VM script exit %d", res.Exit))
			}
			if !strings.Contains(h.Output(), "qid 1 connected") || !strings.Contains(h2.Output(), "qid 1 connected") {
				probs = append(probs, "the host did not connect to the target before and after its restart")
			}
			m := reNvmfIntact.FindStringSubmatch(res.Output)
			if m == nil {
				probs = append(probs, "the VM's read-back differs from what it wrote, or a write failed")
			} else if f, err := os.ReadFile(file); err != nil || len(f) < blocks<<16 {
				probs = append(probs, fmt.Sprintf("the target's file: %v", err))
			} else if sum := md5.Sum(f[:blocks<<16]); hex.EncodeToString(sum[:]) != m[1] {
				probs = append(probs, "the target's file differs from what the VM wrote")
			}
			if !strings.Contains(res.Output, "Successfully reconnected") {
				probs = append(probs, "no 'Successfully reconnected' in the VM's kernel log")
			}
			if len(probs) > 0 {
				r.counters = strings.Join(probs, "; ")
				t.Errorf("%s\n--- VM output:\n%s\n--- target before:\n%s\n--- target after:\n%s", strings.Join(probs, "\n"), res.Output, tail(out, 30), tail(h2.Output(), 30))
				return
			}
			r.result = "ok"
			r.counters = "file and read-back equal"
			if l := regexp.MustCompile(`(?m)^\[ *[0-9.]+\] (nvme nvme0: Successfully reconnected.*)$`).FindStringSubmatch(res.Output); l != nil {
				r.counters = l[1] + "; file and read-back equal"
			}
			t.Logf("%s: %s", name, strings.ReplaceAll(strings.TrimSpace(res.Output), "\n", " | "))
		})
	}
}
